# Thin entry points; the work is in scripts/ and playbooks/.
SHELL := /bin/bash
ENV := source scripts/env.sh &&
LAB_ARGS ?=
# the labs benchmarks/ makes (benchmarks/scale.sh, benchmarks/health_quick.sh): lab-down removes them too
BENCH_LABS ?= lab-scale lab-hbench

.PHONY: setup lab lab-up lab-down test lint unit sanity
setup:            ## controller set-up: system packages, .venv, collection link
	bash scripts/setup.sh

lab: setup        ## the main job: lab up, site.yml on it, then the example trained with deepspeed
	$(ENV) ansible-playbook lab/lab.yml -i lab/controller.yml $(LAB_ARGS)
	$(ENV) ansible-playbook playbooks/site.yml -i lab/inventory
	$(ENV) ansible-playbook playbooks/train.yml -i lab/inventory -e training_wait=finished $(TRAIN_ARGS); \
	  rc=$$?; echo; echo "The lab stays up: ansible-playbook ... -i lab/inventory works on it (see above);" \
	  "make lab-down removes it (containers, network, keys, inventory)."; exit $$rc

lab-up: setup     ## only create the lab
	$(ENV) ansible-playbook lab/lab.yml -i lab/controller.yml $(LAB_ARGS)

lab-down: setup   ## remove the lab (containers, network, keys, inventory), and the benchmarks' labs
	$(ENV) ansible-playbook lab/lab.yml -i lab/controller.yml -e lab_state=absent $(LAB_ARGS)
	for lab in $(BENCH_LABS); do $(ENV) ansible-playbook lab/lab.yml -i lab/controller.yml -e lab_state=absent \
	  -e lab_name=$$lab -e lab_inventory_dir=inventories/$$lab || exit 1; done

test:             ## lint, unit/integration tests, ansible-test sanity, collection build, molecule scenarios
	bash scripts/test.sh

lint: setup
	$(ENV) yamllint --strict . && ansible-lint --profile production

unit: setup
	$(ENV) pytest -q

sanity: setup     ## ansible-test sanity on a copy of the tree (scripts/sanity.sh)
	$(ENV) bash scripts/sanity.sh
