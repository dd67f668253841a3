"""Jinja expressions written in YAML without double quotes (plain, single-quoted or block scalars) get their
backslashes as written: Ansible hands `'^\\S+'` inside `{{ }}` or a `when:` to the regex as two backslashes, so
`select('match', '^\\S+ installed$')` matched nothing and a role re-ran apt on every run (the gateway on an offline
node waited on an unreachable mirror). Inside `{% %}` statements the same literal is unescaped, and double-quoted
YAML unescapes it itself. One backslash is right outside double quotes; this keeps every expression that way."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from repo_root import ROOT

# keys whose whole value is a bare Jinja expression
CONDITIONS = {"when", "that", "failed_when", "changed_when", "until"}
EXPRESSION = re.compile(r"\{\{.*?\}\}", re.S)


def doubled_backslashes(text: str, key: str | None, style: str | None) -> list[str]:
    """The expressions of one YAML scalar that carry a doubled backslash where Ansible would not unescape it."""
    if style == '"' or "\\\\" not in text:
        return []
    if key in CONDITIONS and "{{" not in text:
        return [text.strip()]
    return [match for match in EXPRESSION.findall(text) if "\\\\" in match]


def _walk(node: yaml.Node, key: str | None, found: list[str], where: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _walk(v, getattr(k, "value", None), found, where)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _walk(v, key, found, where)
    elif isinstance(node, yaml.ScalarNode):
        for expression in doubled_backslashes(node.value, key, node.style):
            found.append(f"{where.relative_to(ROOT)}:{node.start_mark.line + 1}: {expression[:100]}")


def test_the_check_sees_the_bug_and_leaves_correct_forms_alone() -> None:
    assert doubled_backslashes("{{ x | select('match', '^\\\\S+ installed$') }}", "v", ">")
    assert doubled_backslashes("x | select('match', '^\\\\S+')", "when", None)
    assert not doubled_backslashes("{{ x | select('match', '^\\S+ installed$') }}", "v", ">")
    assert not doubled_backslashes("{{ x | select('match', '^\\\\S+') }}", "v", '"')
    assert not doubled_backslashes("{%- set y = x | regex_findall('a \\\\(b') -%}{{ y }}", "v", ">")


def test_no_doubled_backslash_in_an_expression_outside_double_quotes() -> None:
    found: list[str] = []
    for folder in ("roles", "playbooks", "molecule", "inventories"):
        for path in sorted((ROOT / folder).rglob("*.yml")):
            for document in yaml.compose_all(path.read_text()):
                if document is not None:
                    _walk(document, None, found, path)
    assert not found, "one backslash outside double quotes (this module says why):\n" + "\n".join(found)
