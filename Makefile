# The two commands the README opens with. Both work on a fresh machine:
# scripts/infra/up.sh installs and starts what they need, idempotently.
PY ?= python3

.PHONY: demo test unit lint infra

demo: infra
	stackbuild demo

test: infra lint
	$(PY) -m pytest -m "integration or not integration" -q

unit:
	$(PY) -m pytest -q

lint:
	ruff check builder tests bench
	mypy
	stackbuild render cuda13 --check

infra:
	bash scripts/infra/up.sh
