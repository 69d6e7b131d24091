"""The deploy side: SSH to a host, preflight, state and lease, deploy/rollback/status.

`ssh` is the one module that talks SSH; everything else receives a `Remote`.
"""
