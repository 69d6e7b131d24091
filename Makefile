# The two commands the README opens with. Both work on a fresh machine:
# they install the project (editable, with its dev extras) and scripts/infra/up.sh
# installs and starts the infrastructure, both idempotently.
PY ?= python3
# Debian's python3 marks itself externally managed (PEP 668); the README's commands own this machine.
PIP = PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 $(PY) -m pip
STAMP = .stackbuild/install.stamp

.PHONY: demo test unit lint infra install

demo: infra install
	$(PY) -m stackbuild demo

# Five workers on two cores: each integration test waits on hosts and servers much of its time,
# but five of them keep the CPUs ~80% busy (docs/testing.md, Workers): more only add noise to
# the gates. A module's tests stay together on one worker unless it says PER_TEST (tests/conftest.py).
test: infra install lint
	STACKBUILD_FUZZ=full $(PY) -m pytest -m "integration or not integration" -q -n 5 --dist loadgroup

unit: install
	$(PY) -m pytest -q -n 2

lint: install
	$(PY) -m ruff check stackbuild tests bench
	$(PY) -m mypy
	$(PY) -m stackbuild render cuda13 --check
	$(PY) -m stackbuild lock --check

install: $(STAMP)

# Re-installed only when the dependencies change; the editable install tracks the code itself.
$(STAMP): pyproject.toml
	$(PIP) install -q -e '.[dev]'
	mkdir -p $(@D) && touch $@

infra:
	bash scripts/infra/up.sh
