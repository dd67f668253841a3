"""systemd helpers shared by the modules: one `systemctl show` call and one parser for its output."""

from __future__ import annotations

from collections.abc import Callable, Iterable

# run_command(argv) -> (rc, stdout, stderr), e.g. AnsibleModule.run_command
Runner = Callable[[list], tuple]


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` KEY=VALUE lines as a dict (values may contain '='; lines without one are skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def unix_time(value: str | None) -> int | None:
    """A `--timestamp=unix` property ('@1764600000') as int seconds; None when empty or not a time."""
    stamp = (value or "").strip().lstrip("@")
    return int(stamp) if stamp.isdigit() else None


def show_command(unit: str, properties: Iterable[str]) -> list[str]:
    """argv of `systemctl show` for the given properties, timestamps as unix seconds."""
    return ["systemctl", "show", unit, "--timestamp=unix", "-p", ",".join(properties)]


def show(run: Runner, unit: str, properties: Iterable[str]) -> dict[str, str]:
    """The unit's properties; raises RuntimeError with systemctl's message when the call fails."""
    rc, out, err = run(show_command(unit, properties))
    if rc != 0:
        raise RuntimeError(f"systemctl show {unit} failed (rc {rc}): {str(err).strip()}")
    return parse_show(out)
