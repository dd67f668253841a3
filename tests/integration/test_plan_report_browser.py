"""The plan as a picture, in a real headless browser (Debian's chromium).

`make plan` for the story's refused request (262,144 tokens of bf16 KV for Kimi-K2.5-NVFP4 on 8 x RTX PRO 6000)
writes plan.html beside plan.json. Chromium loads it from disk with no network: the page's script runs, Chart.js
draws the chart, the table the script builds carries the same numbers as the plan JSON (and vLLM's reported figures
from an inference check report beside them), and a screenshot shows the red
"KV cache needed beyond the budget" part of the bars.
Skipped when chromium is not installed locally; under CI (CI=true) a missing chromium fails instead:
scripts/ensure-test-tools.sh, which .ci/run calls, installs it.
PLAN_REPORT_SCREENSHOT=/path/plan.png keeps the screenshot for a person to look at.
The inference check's page (the serving benchmark's latency percentiles, same rendering and library) is loaded the
same way: it renders, its chart draws, and the latencies the script put in its table are the report JSON's.
"""
from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from test_plan_playbook import STORY, plan

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.plan_report import check_report_html
from check_reports import check_report

CHROMIUM = shutil.which("chromium")
WIDTH, HEIGHT = 1100, 900
GIB = 1 << 30
# What the inference check read from vLLM's log on a node (made up, 8 ranks; rank 7 logged no KV figure).
CHECK = {"host": "node1", "time": "2026-12-01T10:00:00Z", "url": "http://127.0.0.1:8000",
         "plan": {"model": "kimi-k2.5-nvfp4", "max_model_len": 131072},
         "startup": {"model_loading_bytes": [71 * GIB + i for i in range(8)],
                     "available_kv_cache_bytes": [11 * GIB + i for i in range(7)]}}
# The page's colour for the KV cache the request needs beyond the budget (#d62728).
OVER_BUDGET_RGB = (0xD6, 0x27, 0x28)

if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing under CI: scripts/ensure-test-tools.sh (called by .ci/run) installs it",
                    pytrace=False)
    pytestmark = pytest.mark.skip(reason="chromium is not installed (apt-get install chromium, or run "
                                         "scripts/ensure-test-tools.sh as root); the browser test needs it")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless chromium with a throwaway profile; root needs --no-sandbox; no network is used."""
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


class Dom(html.parser.HTMLParser):
    """The rendered DOM's body attributes, canvas elements and the data attributes of the table's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str | None] = {}
        self.canvases: list[dict[str, str | None]] = []
        self.rows: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "body":
            self.body = attributes
        elif tag == "canvas":
            self.canvases.append(attributes)
        elif tag == "tr" and ("data-segment" in attributes or "data-ms" in attributes):
            self.rows.append(attributes)


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """make plan for the story's refused request: its plan.json (parsed) and plan.html."""
    tmp = tmp_path_factory.mktemp("plan-report")
    # An inference check report whose start-up figures (per rank) the page shows beside the plan.
    check = tmp / "inference-check.json"
    check.write_text(json.dumps(CHECK))
    run = plan(tmp, *STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16", "-e", "vllm_node_max_model_len=262144",
               "-e", "vllm_node_gpu_memory_utilization=0.95", "-e", f"preflight_plan_report_check_file={check}")
    assert run.rc != 0 and run.plan is not None and run.plan["fits"] is False, run.out
    page = tmp / "plan.html"
    assert page.is_file(), "the refused plan still writes its picture beside plan.json\n" + run.out
    assert f"Picture: {page}" in " ".join(run.out.split()), "the refusal names the page"
    return page, run.plan


def test_the_page_renders_the_chart_and_its_numbers_match_the_plan_json(refused, tmp_path: Path) -> None:
    page, data = refused
    proc = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr
    dom = Dom()
    dom.feed(proc.stdout)
    assert dom.body.get("data-rendered") == "true", "the page's script did not finish:\n" + proc.stderr[-2000:]
    assert [c.get("id") for c in dom.canvases] == ["memory-chart"]
    assert int(dom.body["data-chart-ink-pixels"] or 0) > 10_000, "Chart.js drew (almost) nothing on the canvas"
    per_gpu, kv = data["per_gpu"], data["kv"]
    assert int(dom.body["data-budget-bytes"] or 0) == per_gpu["requested_bytes"]
    assert int(dom.body["data-total-bytes"] or 0) == per_gpu["total_bytes"]
    # Every planned segment of every GPU, as the page's script rendered it, against the plan JSON.
    expected = {"weights": per_gpu["weights_bytes"], "activation_peak": per_gpu["activation_peak_bytes"],
                "cudagraph": per_gpu["cudagraph_bytes"], "kv_cache": per_gpu["kv_cache_bytes"],
                "kv_over_budget": kv["needed_bytes"] - kv["available_bytes"],
                "non_torch": per_gpu["non_torch_bytes"], "headroom": per_gpu["headroom_bytes"]}
    rendered = {(int(r["data-gpu"] or -1), r["data-segment"]): int(r["data-bytes"] or -1)
                for r in dom.rows if r.get("data-stack") == "planned"}
    assert rendered == {(gpu, key): value for gpu in range(data["gpu_count"]) for key, value in expected.items()}
    # vLLM's reported figures per rank, beside the plan, from the check report the play read.
    reported = {(int(r["data-gpu"] or -1), r["data-segment"]): int(r["data-bytes"] or -1)
                for r in dom.rows if r.get("data-stack") == "reported"}
    startup = CHECK["startup"]
    assert reported == {**{(i, "weights"): b for i, b in enumerate(startup["model_loading_bytes"])},
                        **{(i, "kv_cache"): b for i, b in enumerate(startup["available_kv_cache_bytes"])}}
    # At a glance: what the budget holds plus the KV the request still needs passes the budget line.
    stacked = sum(expected[k] for k in ("weights", "activation_peak", "cudagraph", "kv_cache", "kv_over_budget"))
    assert stacked > per_gpu["requested_bytes"]


def test_a_screenshot_shows_the_kv_over_budget_in_red(refused, tmp_path: Path) -> None:
    page, _data = refused
    shot = Path(os.environ.get("PLAN_REPORT_SCREENSHOT", tmp_path / "plan.png"))
    proc = chromium(tmp_path / "profile", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr
    with Image.open(shot) as image:
        assert image.format == "PNG"
        assert image.size == (WIDTH, HEIGHT)
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "the screenshot is (nearly) blank"
    red = sum(count for count, colour in colours if colour == OVER_BUDGET_RGB)
    # Eight planned bars' over-budget parts (5.56 GiB each, ~18 px high, ~35 px wide beside the reported bars:
    # ~4,500 px); the legend swatch alone is ~470 px (the budget line is another red, #8b0000).
    assert red > 2_000, f"only {red} pixels of the over-budget red in the screenshot"


ROOT = Path(__file__).resolve().parents[2]


def test_the_check_page_draws_the_benchmark_latencies_of_its_json(tmp_path: Path) -> None:
    report = check_report()
    page = tmp_path / "inference-check-node1.html"
    page.write_text(check_report_html(
        report, (ROOT / "roles/inference_check/templates/inference-check.html.j2").read_text(),
        (ROOT / "roles/preflight/files/chartjs/chart.umd.min.js").read_text()))
    (tmp_path / "inference-check-node1.json").write_text(json.dumps(report))
    proc = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr
    dom = Dom()
    dom.feed(proc.stdout)
    assert dom.body.get("data-rendered") == "true", "the page's script did not finish:\n" + proc.stderr[-2000:]
    assert [c.get("id") for c in dom.canvases] == ["latency-chart"]
    assert dom.body.get("data-datasets") == "2", "one bar series per concurrency level"
    assert int(dom.body["data-chart-ink-pixels"] or 0) > 5_000, "Chart.js drew (almost) nothing on the canvas"
    # Every latency percentile of every level, as the page's script rendered it, against the JSON beside the page.
    written = json.loads((tmp_path / "inference-check-node1.json").read_text())["benchmark"]["levels"]
    rendered = {(r["data-level"], r["data-figure"]): float(r["data-ms"] or "nan") for r in dom.rows if "data-ms" in r}
    assert rendered == {(level, key): figs[key] for level, figs in written.items()
                        for key in ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50",
                                    "itl_ms_p99")}


def test_a_split_page_draws_every_gpus_stack_per_instance(tmp_path: Path) -> None:
    """Several models on one node: the page of a split that fits (a 70B on 2, gpt-oss-120b on 4, Qwen3-Next on 2)
    draws, on every GPU, the stack of the instance that runs there, segment by segment as its own plan says, and
    what stays free up to the GPU's memory."""
    items = [{"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2},
             {"name": "gptoss", "model": "gpt-oss-120b", "gpus": 4},
             {"name": "qwen-next", "model": "qwen3-next-80b-a3b-instruct", "gpus": 2}]
    run = plan(tmp_path, "-e", "vllm_node_gpu=rtx-pro-6000-blackwell", "-e", "vllm_node_gpu_count=8",
               "-e", json.dumps({"vllm_node_instances": items}))
    assert run.rc == 0 and run.plan is not None, run.out
    proc = chromium(tmp_path / "profile", "--dump-dom", (tmp_path / "plan.html").as_uri())
    assert proc.returncode == 0, proc.stderr
    dom = Dom()
    dom.feed(proc.stdout)
    assert dom.body.get("data-rendered") == "true", "the page's script did not finish:\n" + proc.stderr[-2000:]
    assert int(dom.body["data-chart-ink-pixels"] or 0) > 10_000, "Chart.js drew (almost) nothing on the canvas"
    fields = {"weights": "weights_bytes", "activation_peak": "activation_peak_bytes", "cudagraph": "cudagraph_bytes",
              "kv_cache": "kv_cache_bytes", "non_torch": "non_torch_bytes"}
    expected = {(gpu, row["name"], key): row["plan"]["per_gpu"][field] if gpu in row["gpus"] else 0
                for row in run.plan["instances"] for gpu in range(8) for key, field in fields.items()}
    rendered = {(int(r["data-gpu"] or -1), r["data-instance"], r["data-segment"]): int(r["data-bytes"] or -1)
                for r in dom.rows if r.get("data-stack") == "planned" and r["data-segment"] in fields}
    assert rendered == expected
    free = {int(r["data-gpu"] or -1): int(r["data-bytes"] or -1) for r in dom.rows if r["data-segment"] == "headroom"}
    assert free == {g["index"]: g["total_bytes"] - g["used_bytes"] for g in run.plan["gpus"]}
