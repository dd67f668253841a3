"""What model_download does on the node (run by the module model_download_node): plain os/subprocess code.

Every function that changes something takes `check` (report, change nothing) and returns whether it changed (or
would change) anything, so that a converged rerun reports no change.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf

CHUNK = 1 << 20


# ---- directories and files -------------------------------------------------------------------------------------


def ids(owner: str, group: str) -> tuple[int, int]:
    """uid and gid of a user and group name (KeyError when one does not exist)."""
    return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid


def ensure_dir(path: str, uid: int, gid: int, mode: int, check: bool) -> bool:
    """mkdir -p path and give it owner, group and mode (the parents it creates: root, 0755)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not check:
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        return True
    changed = (info.st_uid, info.st_gid) != (uid, gid) or stat.S_IMODE(info.st_mode) != mode
    if changed and not check:
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    return changed


def read_text(path: str) -> str | None:
    """A small file's text, None when it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> Any:
    """A JSON document, None when the file does not exist or does not parse."""
    text = read_text(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def write_json(path: str, doc: Mapping[str, Any], uid: int, gid: int, check: bool) -> dict[str, Any]:
    """Write a record atomically (0640) when its text changes; returns {changed, diff}."""
    text = json.dumps(doc, indent=4, sort_keys=True) + "\n"
    before = read_text(path)
    diff = {"before": before or "", "after": text, "before_header": path, "after_header": path}
    if before == text:
        return {"changed": False, "diff": diff}
    if not check:
        tmp = f"{path}.vllm-node-tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chown(tmp, uid, gid)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    return {"changed": True, "diff": diff}


def list_files(directory: str) -> dict[str, int]:
    """{relative path: size} of the regular files below a directory (hidden ones and hf's .cache included)."""
    out: dict[str, int] = {}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                out[os.path.relpath(path, directory)] = info.st_size
    return out


def tree_bytes(directory: str) -> int:
    """Bytes below a directory, hf's partial files (.cache/huggingface/download/*.incomplete) included."""
    return sum(list_files(directory).values()) if os.path.isdir(directory) else 0


def own_tree(directory: str, uid: int, gid: int, check: bool) -> bool:
    """chown -R owner:group and chmod -R u=rwX,g=rX,o= (what the service user needs to read the model)."""
    changed = False
    for root, dirs, names in os.walk(directory):
        for path in [root] + [os.path.join(root, n) for n in names]:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            executable = stat.S_ISDIR(info.st_mode) or bool(info.st_mode & 0o111)
            mode = 0o750 if executable else 0o640
            if (info.st_uid, info.st_gid) != (uid, gid) or stat.S_IMODE(info.st_mode) != mode:
                changed = True
                if not check:
                    os.chown(path, uid, gid)
                    os.chmod(path, mode)
        dirs.sort()
    return changed


def restore_originals(directory: str, names: Iterable[str], uid: int, gid: int) -> bool:
    """Put back model_config's kept originals (<file>.orig) before hf compares checksums (a copy, then a rename)."""
    changed = False
    for name in names:
        source, dest = os.path.join(directory, name + ".orig"), os.path.join(directory, name)
        if os.path.exists(dest) and file_sha256(dest) == file_sha256(source):
            continue
        tmp = f"{dest}.vllm-node-tmp.{os.getpid()}"
        shutil.copyfile(source, tmp)
        os.chown(tmp, uid, gid)
        os.chmod(tmp, 0o640)
        os.replace(tmp, dest)
        changed = True
    return changed


def forget(directory: str, paths: Iterable[str]) -> None:
    """Delete files that failed verification and hf's bookkeeping of them, so that hf fetches them again."""
    for path in paths:
        for victim in (os.path.join(directory, path),
                       os.path.join(directory, mdf.HF_METADATA_DIR, path + ".metadata")):
            if os.path.lexists(victim):
                os.unlink(victim)


def file_sha256(path: str) -> str:
    """sha256 hex of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_small_files(directory: str, paths: Iterable[str]) -> dict[str, str]:
    """sha256 of the bytes as downloaded: model_config's <file>.orig where it patched the file."""
    out = {}
    for path in paths:
        full = os.path.join(directory, path)
        out[path] = file_sha256(full + ".orig" if os.path.exists(full + ".orig") else full)
    return out


# ---- the layout before revisions/ -------------------------------------------------------------------------------


def flat_entries(base_dir: str) -> list[str]:
    """Names directly in the model directory that belong to no current layout (the files before revisions/)."""
    if not os.path.isdir(base_dir):
        return []
    return sorted(n for n in os.listdir(base_dir) if not mdf.layout_excluded(n))


def move_flat(base_dir: str, names: list[str], target: str) -> list[str]:
    """mv --no-clobber the names into target (a rename on one filesystem); returns what could not move."""
    left = []
    for name in names:
        dest = os.path.join(target, name)
        if os.path.lexists(dest):
            left.append(os.path.join(base_dir, name))
            continue
        os.rename(os.path.join(base_dir, name), dest)
    return left


# ---- revisions: markers and pruning ------------------------------------------------------------------------------


def revision_names(revisions_dir: str) -> list[str]:
    """The 40-hex directories in <base>/revisions."""
    if not os.path.isdir(revisions_dir):
        return []
    return sorted(n for n in os.listdir(revisions_dir)
                  if mdf.is_commit(n) and os.path.isdir(os.path.join(revisions_dir, n)))


def markers(revisions_dir: str) -> dict[str, str]:
    """{commit: text of its completion marker} of every revision that has one."""
    out = {}
    for name in revision_names(revisions_dir):
        text = read_text(os.path.join(revisions_dir, name, mdf.MARKER_NAME))
        if text is not None:
            out[name] = text
    return out


def prune(revisions_dir: str, serving: str, keep: int, check: bool) -> list[str]:
    """Delete the revision directories not kept (mdf.prune_plan); returns their names."""
    completed = {}
    for name in revision_names(revisions_dir):
        try:
            completed[name] = os.stat(os.path.join(revisions_dir, name, mdf.MARKER_NAME)).st_mtime
        except FileNotFoundError:
            continue
    victims = mdf.prune_plan(revision_names(revisions_dir), completed, serving, keep)
    if not check:
        for name in victims:
            shutil.rmtree(os.path.join(revisions_dir, name))
    return victims


# ---- models no unit serves any more ------------------------------------------------------------------------------


def real_dir(path: str) -> bool:
    """A directory, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def scan_models(root: str) -> dict[str, Any]:
    """The listing mdf.unserved_plan reads: <root>/<org>/<name> directories with the repo their record names, their
    entries and their revisions/ directories (real directories only; symbolic links are nobody's model)."""
    orgs: dict[str, Any] = {}
    if not real_dir(root):
        return {"root": root, "orgs": orgs}
    for org in sorted(os.listdir(root)):
        org_dir = os.path.join(root, org)
        if not real_dir(org_dir):
            continue
        names = sorted(os.listdir(org_dir))
        repos = {}
        for name in names:
            base = os.path.join(org_dir, name)
            if not real_dir(base):
                continue
            record = read_json(os.path.join(base, mdf.RECORD_NAME)) if os.path.isfile(
                os.path.join(base, mdf.RECORD_NAME)) else None
            revisions = os.path.join(base, "revisions")
            inside = sorted(os.listdir(revisions)) if real_dir(revisions) else []
            repos[name] = {
                "record": record.get("repo") if isinstance(record, dict) else None,
                "entries": sorted(os.listdir(base)),
                "revisions": [n for n in inside if real_dir(os.path.join(revisions, n))]
                if real_dir(revisions) else None,
                "revisions_other": [n for n in inside if not real_dir(os.path.join(revisions, n))],
            }
        orgs[org] = {"entries": names, "repos": repos}
    return {"root": root, "orgs": orgs}


def inodes(paths: Iterable[str]) -> list[tuple[int, int, int, int]]:
    """(device, inode, size, link count) of every non-directory below the paths (a path itself when it is a file)."""
    out = []
    for top in paths:
        names = [os.path.join(d, n) for d, _s, ns in os.walk(top) for n in ns] if real_dir(top) else [top]
        for path in names:
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            out.append((info.st_dev, info.st_ino, info.st_size, info.st_nlink))
    return out


def delete_unserved(plan: Iterable[Mapping[str, Any]], check: bool) -> list[dict[str, Any]]:
    """Delete what mdf.unserved_plan chose (trees, files, then the emptied directories); returns each repo with
    the bytes it freed (measured before, hard links shared with what stays not counted)."""
    done = []
    for item in plan:
        freed = mdf.freed_bytes(inodes(item["paths"]))
        if not check:
            for path in item["paths"]:
                if real_dir(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.unlink(path)
            for path in item["rmdirs"]:
                os.rmdir(path)
        done.append({**item, "bytes": freed})
    return done


# ---- hf ----------------------------------------------------------------------------------------------------------


def write_token(token_file: str, token: str) -> None:
    """The Hub token in a 0600 root file, for HF_TOKEN_PATH (nothing when there is no token)."""
    if not token:
        return
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token)


def remove(path: str) -> None:
    """rm -f."""
    if os.path.lexists(path):
        os.unlink(path)


def run_hf(argv: list[str], env: Mapping[str, str], token_file: str, token: str, timeout: int) -> dict[str, Any]:
    """Run hf in the foreground with the token in a private file for its duration; returns {rc, stdout, stderr}."""
    write_token(token_file, token)
    try:
        proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
        return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "cmd": argv}
    except subprocess.TimeoutExpired as exc:
        return {"rc": None, "stdout": "", "stderr": str(exc), "cmd": argv, "msg": f"timed out after {timeout} s"}
    except OSError as exc:
        return {"rc": None, "stdout": "", "stderr": str(exc), "cmd": argv, "msg": str(exc)}
    finally:
        remove(token_file)


def spawn(argv: list[str], env: Mapping[str, str], job_dir: str, token_file: str, token: str, timeout: int) -> int:
    """Start hf detached from the module (double fork, own session): it outlives this call. A runner process waits
    for it (killing it after timeout seconds), writes <job_dir>/status.json and removes the token file. Returns
    the runner's pid."""
    os.makedirs(os.path.dirname(job_dir), mode=0o700, exist_ok=True)
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    write_token(token_file, token)
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # pragma: no cover - runs in the forked children
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            _run_job(argv, env, job_dir, token_file, timeout)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    with os.fdopen(read_end) as handle:
        return int(handle.read() or 0)


def _run_job(argv: list[str], env: Mapping[str, str], job_dir: str, token_file: str,
             timeout: int) -> None:  # pragma: no cover - runs in the detached runner
    """The detached runner: hf with its output in files, then the status."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    status: dict[str, Any] = {"cmd": argv}
    with open(os.path.join(job_dir, "stdout"), "wb") as out, open(os.path.join(job_dir, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, close_fds=True)
            # Written whole (rename) so that stop() never reads a pid file that exists but is still empty.
            with open(os.path.join(job_dir, "hf.pid.tmp"), "w") as handle:
                handle.write(str(proc.pid))
            os.replace(os.path.join(job_dir, "hf.pid.tmp"), os.path.join(job_dir, "hf.pid"))
            try:
                status["rc"] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status.update(rc=None, msg="Timeout exceeded")
        except OSError as exc:
            status.update(rc=None, msg=str(exc))
    remove(token_file)
    tmp = os.path.join(job_dir, "status.json.tmp")
    with open(tmp, "w") as handle:
        json.dump(status, handle)
    os.replace(tmp, os.path.join(job_dir, "status.json"))


def job_status(job_dir: str, runner_pid: int) -> dict[str, Any]:
    """{finished, rc, stdout, stderr, msg} of a background job; failed when its runner vanished without a status."""
    status = read_json(os.path.join(job_dir, "status.json"))
    if isinstance(status, dict):
        return {"finished": True, **status, "stdout": read_text(os.path.join(job_dir, "stdout")) or "",
                "stderr": read_text(os.path.join(job_dir, "stderr")) or ""}
    if not alive(runner_pid) and read_json(os.path.join(job_dir, "status.json")) is None:
        return {"finished": False, "lost": True, "msg": f"the runner (pid {runner_pid}) ended without a status"}
    return {"finished": False}


def alive(pid: int) -> bool:
    """Whether a process exists (zombies of this process aside, the runner is not our child)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(job_dir: str, token_file: str) -> bool:
    """End a background job (kill hf if it still runs), remove its files and the token file; True if killed."""
    killed = False
    if read_json(os.path.join(job_dir, "status.json")) is None:
        text = read_text(os.path.join(job_dir, "hf.pid"))
        if text and text.strip().isdigit() and alive(int(text)):
            os.kill(int(text), signal.SIGTERM)
            killed = True
            for _ in range(50):
                if read_json(os.path.join(job_dir, "status.json")) is not None:
                    break
                time.sleep(0.1)
    shutil.rmtree(job_dir, ignore_errors=True)
    remove(token_file)
    return killed
