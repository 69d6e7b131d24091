"""Fleet rollout: one candidate across many hosts, a canary first, then gated and soaked waves.

Every host is deployed, gated and rolled back by the single-host code
(stackbuild.host); this package only chooses the order, runs each wave's hosts
in parallel, watches them while they bake, and decides for the whole wave.
"""
