"""Fakes of our own effects, for tests only: the scripted host, systemd, servers, the gateway
and the process runner. Production code never imports them (tests/test_layout.py)."""
