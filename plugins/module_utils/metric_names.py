"""Metric names a PromQL expression reads, and the contract check of dashboards and alert rules against a scrape.

No PromQL parser is packaged for Python on the project's pinned index, so this is a tokenizer that knows what is
not a metric name: string literals, label matchers ({...}), range and subquery brackets ([...]), numbers and
durations, Grafana variables ($x, ${x}, [[x]]), functions (a name followed by an opening parenthesis), the
aggregation, set and modifier keywords, and the label lists after by/without/on/ignoring/group_left/group_right.
A selector written as {__name__="x"} counts as the metric x.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Words PromQL reserves (aggregations, binary set operators, modifiers, literals); never metric names.
_KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "limitk", "limit_ratio", "and", "or", "unless", "atan2", "by", "without", "on", "ignoring", "group_left",
    "group_right", "offset", "bool", "inf", "nan",
})
# Keywords followed by a parenthesised list of label names (skipped: labels are not metrics).
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[A-Za-z0-9_]*")
_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(["'`])([^"'`]*)\1""")
# Suffixes a histogram or summary family exposes as samples.
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count")


def _closing(expr: str, start: int, opening: str, closing: str) -> int:
    """Index just past the bracket matching the one at `start`, skipping string literals."""
    depth, i = 0, start
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            i = _string_end(expr, i)
            continue
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {opening!r} at offset {start} in PromQL expression: {expr!r}")


def _string_end(expr: str, start: int) -> int:
    """Index just past the string literal opening at `start` (backslash escapes, not in backtick strings)."""
    quote, i = expr[start], start + 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string at offset {start} in PromQL expression: {expr!r}")


def _next_char(expr: str, i: int) -> str:
    """The first non-blank character at or after `i` ('' at the end)."""
    while i < len(expr) and expr[i].isspace():
        i += 1
    return expr[i] if i < len(expr) else ""


def promql_metric_names(expr: str) -> set[str]:
    """Every metric name the PromQL expression `expr` selects (histogram suffixes kept as written).

    >>> sorted(promql_metric_names('histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="b"}[5m])))'))
    ['x_bucket']
    """
    names: set[str] = set()
    i = depth = 0
    while i < len(expr):
        char = expr[i]
        if char in "()":
            depth += 1 if char == "(" else -1
            if depth < 0:
                raise ValueError(f"unbalanced ')' at offset {i} in PromQL expression: {expr!r}")
            i += 1
        elif char.isspace():
            i += 1
        elif char == "#":  # a comment runs to the end of the line
            newline = expr.find("\n", i)
            i = len(expr) if newline < 0 else newline + 1
        elif char in "\"'`":
            i = _string_end(expr, i)
        elif char == "{":
            end = _closing(expr, i, "{", "}")
            names.update(match.group(2) for match in _NAME_MATCHER.finditer(expr[i:end]))
            i = end
        elif char == "[":
            # a range/subquery duration, or Grafana's [[variable]]
            i = _closing(expr, i, "[", "]")
        elif char == "$":
            variable = re.compile(r"\$(?:\{[^}]*\}|\w+)").match(expr, i)
            i = variable.end() if variable else i + 1
        elif char.isdigit() or (char == "." and expr[i + 1:i + 2].isdigit()):
            number = _NUMBER.match(expr, i)
            i = number.end() if number else i + 1
        elif (ident := _IDENT.match(expr, i)) is not None:
            word, i = ident.group(0), ident.end()
            following = _next_char(expr, i)
            if word.lower() in _LABEL_LIST_KEYWORDS:
                if following == "(":
                    i = _closing(expr, expr.index("(", i), "(", ")")
            elif word.lower() in _KEYWORDS or following == "(":
                continue  # a keyword, or a function call
            else:
                names.add(word)
        else:
            i += 1
    if depth:
        raise ValueError(f"unbalanced '(' in PromQL expression: {expr!r}")
    return names


def exposition_names(text: str) -> set[str]:
    """Sample names in Prometheus text exposition `text` (a /metrics scrape), plus the family names its
    `# TYPE` lines declare (a labelled family with no child yet has no sample but is declared)."""
    names: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "TYPE":
                names.add(parts[2])
            continue
        match = _IDENT.match(line)
        if match:
            names.add(match.group(0))
    return names


def family_name(name: str) -> str:
    """The family a sample name belongs to (x_bucket, x_sum, x_count -> x)."""
    for suffix in _SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def dashboard_expressions(dashboard: Mapping) -> dict[str, list[str]]:
    """PromQL expressions of a Grafana dashboard, by panel title (rows' nested panels included) and, under
    'templating:<name>', its variables' queries."""
    found: dict[str, list[str]] = {}

    def panels(items: Iterable[Mapping]) -> None:
        for panel in items:
            exprs = [target["expr"] for target in panel.get("targets", []) if target.get("expr")]
            if exprs:
                found.setdefault(panel.get("title") or f"panel {panel.get('id')}", []).extend(exprs)
            panels(panel.get("panels", []))

    panels(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, Mapping):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            found[f"templating:{variable.get('name')}"] = [grafana_variable_selector(str(query))]
    return found


def grafana_variable_selector(query: str) -> str:
    """The PromQL part of a Grafana variable query: label_values(selector, label) -> selector (the label is not a
    metric), label_values(label) -> '', query_result(expr) -> expr, metrics(regex) -> ''; other text unchanged."""
    match = re.fullmatch(r"\s*(label_values|query_result|metrics|label_names)\s*\((.*)\)\s*", query, re.S)
    if not match:
        return query
    function, args = match.groups()
    if function == "query_result":
        return args
    if function == "label_values" and "," in args:
        return args.rsplit(",", 1)[0]
    return ""


def rule_expressions(rules: Mapping) -> dict[str, list[str]]:
    """PromQL expressions of a Prometheus rules file, by alert (or recording rule) name."""
    return {
        str(rule.get("alert") or rule.get("record")): [str(rule["expr"])]
        for group in rules.get("groups", [])
        for rule in group.get("rules", [])
    }


def missing_metric_names(expressions: Mapping[str, Iterable[str]], exposed: Iterable[str],
                         prefixes: Iterable[str] = ("",)) -> dict[str, list[str]]:
    """Per panel or alert, the metric names its expressions use that the scrape `exposed` does not carry.

    Only names starting with one of `prefixes` are checked (e.g. 'vllm:' against vLLM's scrape, 'DCGM_' against
    dcgm-exporter's). A histogram's _bucket/_sum/_count is satisfied by its samples or its declared family.
    """
    exposed_set = set(exposed)
    prefix_tuple = tuple(prefixes)
    missing: dict[str, list[str]] = {}
    for where, exprs in expressions.items():
        gone = sorted({
            name for expr in exprs for name in promql_metric_names(expr)
            if name.startswith(prefix_tuple) and name not in exposed_set and family_name(name) not in exposed_set
        })
        if gone:
            missing[where] = gone
    return missing
