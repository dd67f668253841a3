# Thin targets; the work is in scripts/, playbooks/ and molecule/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PY_COLORS := 0
export ANSIBLE_FORCE_COLOR := 0

# Scenarios `make test` runs, in order (cheapest first). Override: make molecule MOLECULE_SCENARIOS="node_facts".
MOLECULE_SCENARIOS ?= node_facts nvidia_driver nvidia_driver_refusals vllm_env model_pipeline site_e2e
# 2 = the heavy scenarios run in one lane beside the others (see scripts/molecule-lanes.sh); measured in a cold
# .ci/run on an idle 2-core machine: model_pipeline 17 min + site_e2e 12 min against 20 min for the other four.
MOLECULE_JOBS ?= 2
MOLECULE_HEAVY ?= model_pipeline site_e2e
# Base images the scenarios use (built with debootstrap + docker import, cached).
BASE_IMAGES ?= bookworm noble

# Time each stage and print it, so slow stages are visible in CI logs.
define timed
	@t0=$$(date +%s); $(2); echo "== stage $(1): $$(( $$(date +%s) - t0 )) s"
endef

.PHONY: help setup docker images fixtures lint unit integration molecule test demo plan clean

help:
	@echo "make demo   deploy the demo node (a systemd container with CPU vLLM and a tiny model)"
	@echo "make test   everything CI runs: lint, unit, integration, molecule scenarios"
	@echo "make plan   size a deployment, e.g. make plan ARGS='-e vllm_node_model=kimi-k2.5-nvfp4 ...'"
	@echo "make lint | unit | integration | molecule | images | setup"

setup:
	@bash scripts/setup-controller.sh

docker:
	@bash scripts/ensure-docker.sh

images: docker
	$(call timed,images,bash tests/images/build-base-images.sh $(BASE_IMAGES))

lint: setup
	$(call timed,lint,yamllint --strict . && ansible-lint --offline --profile production)

unit: setup
	$(call timed,unit,scripts/pytest-strict.sh tests/unit)

# images: tests/integration/test_inventory_precedence.py renders the unit in a throwaway systemd container.
integration: setup images
	$(call timed,integration,scripts/pytest-strict.sh tests/integration)

molecule: setup images
	$(call timed,molecule,scripts/molecule-lanes.sh $(MOLECULE_JOBS) "$(MOLECULE_HEAVY)" $(MOLECULE_SCENARIOS))

test: lint unit integration molecule
	@echo "== make test: all stages passed"

plan: setup
	ansible-playbook playbooks/plan.yml $(ARGS)

demo: setup images
	@bash scripts/demo.sh

clean:
	rm -rf .cache artifacts/*.json
