"""The gateway client's logic: HttpGateway against scripted smg answers (exact calls), drain on the fake."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers_gateway import worker_api_contract

from stackbuild.effects import http
from stackbuild.effects.gateway import Drained, HttpGateway, Unauthorized, Worker, drain, worker_in_flight
from stackbuild.errors import InfraError
from stackbuild.testing.fake_gateway import FakeClock, FakeGateway

GW = "http://127.0.0.1:30080"
A, B = "http://127.0.0.1:31000", "http://127.0.0.1:31001"
ID_A, ID_B = "01a23d6e-f46c-7449-bf6c-00fdc78d25d2", "01a23d6f-1479-769c-88ff-2e718be76289"


def info(wid: str, url: str, status: str = "ready", load: int = 0) -> dict[str, Any]:
    """One worker as smg 1.13.0's GET /workers lists it (fields trimmed to those we read and a few more)."""
    return {"id": wid, "model_id": "sim/model", "url": url, "worker_type": "regular", "connection_mode": "http",
            "runtime_type": "sglang", "priority": 50, "cost": 1.0, "is_healthy": status == "ready",
            "status": status, "load": load}


def listing(*workers: dict[str, Any]) -> tuple[int, Any]:
    return 200, {"workers": list(workers), "total": len(workers),
                 "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}}


class Script:
    """smg's answers in order; each call must be the one expected."""

    def __init__(self, *steps: tuple[str, str, int, Any]) -> None:
        self.steps = list(steps)
        self.bodies: list[Any] = []

    def __call__(self, method: str, url: str, *, body: bytes | None = None, headers: Any = None,
                 timeout: float = 0) -> http.Reply:
        assert self.steps, f"unexpected {method} {url}"
        want_method, want_path, status, doc = self.steps.pop(0)
        assert (method, url) == (want_method, GW + want_path)
        self.bodies.append(json.loads(body) if body else None)
        return http.Reply(status, doc if isinstance(doc, bytes) else json.dumps(doc).encode(), {})


def gateway(script: Script, clock: FakeClock | None = None) -> HttpGateway:
    return HttpGateway(GW + "/", send=script, pace=(clock or FakeClock()).pace(0.5))


def test_workers_reads_smgs_listing() -> None:
    script = Script(("GET", "/workers", *listing(info(ID_A, A + "/", load=3), info(ID_B, B, "draining"))))
    assert gateway(script).workers() == [Worker(ID_A, A, "ready", True, 3), Worker(ID_B, B, "draining", False, 0)]


def test_add_registers_with_no_settle_and_waits_until_ready() -> None:
    accepted = {"status": "accepted", "worker_id": ID_B, "url": B, "location": f"/workers/{ID_B}"}
    pending = info(ID_B, B, "pending") | {"job_status": {"job_type": "AddWorker", "worker_url": B,
                                                          "status": "processing", "message": None, "timestamp": 1}}
    script = Script(("GET", "/workers", *listing(info(ID_A, A))), ("POST", "/workers", 202, accepted),
                    ("GET", f"/workers/{ID_B}", 200, pending), ("GET", f"/workers/{ID_B}", 200, info(ID_B, B)))
    clock = FakeClock()
    assert gateway(script, clock).add(B + "/", timeout_s=30) == Worker(ID_B, B, "ready", True, 0)
    assert script.bodies[1] == {"url": B, "health": {"drain_settle_secs": 0}}
    assert (script.steps, clock.now) == ([], 0.5)


def test_add_of_a_routable_worker_changes_nothing() -> None:
    script = Script(("GET", "/workers", *listing(info(ID_A, A))))
    assert gateway(script).add(A, timeout_s=30).id == ID_A and script.steps == []


def test_add_waits_for_a_removal_under_way_before_registering_again() -> None:
    script = Script(("GET", "/workers", *listing(info(ID_A, A, "draining"))), ("GET", "/workers", *listing()),
                    ("POST", "/workers", 202, {"worker_id": ID_B}), ("GET", f"/workers/{ID_B}", 200, info(ID_B, A)))
    assert gateway(script).add(A, timeout_s=30).url == A and script.steps == []


def test_add_reports_a_failed_registration_and_a_worker_never_ready() -> None:
    failed = {"id": ID_B, "url": B, "status": "pending", "is_healthy": False, "load": 0,
              "job_status": {"status": "failed", "message": "health check failed for http://127.0.0.1:31001"}}
    script = Script(("GET", "/workers", *listing()), ("POST", "/workers", 202, {"worker_id": ID_B}),
                    ("GET", f"/workers/{ID_B}", 200, failed))
    with pytest.raises(InfraError, match=r"^gateway http://127.0.0.1:30080: adding http://127.0.0.1:31001 failed: "
                                         r"health check failed for http://127.0.0.1:31001$"):
        gateway(script).add(B, timeout_s=30)
    pending = {"id": ID_B, "url": B, "status": "pending", "is_healthy": False, "load": 0}
    script = Script(("GET", "/workers", *listing()), ("POST", "/workers", 202, {"worker_id": ID_B}),
                    *[("GET", f"/workers/{ID_B}", 200, pending)] * 5)
    with pytest.raises(InfraError) as err:
        gateway(script).add(B, timeout_s=2)
    assert str(err.value) == ("gateway http://127.0.0.1:30080: http://127.0.0.1:31001 not ready (status pending) "
                              "after 2s; check the gateway's log")


def test_add_refused_by_the_gateway_is_a_bad_answer() -> None:
    script = Script(("GET", "/workers", *listing()),
                    ("POST", "/workers", 400, {"error": "invalid URL", "code": "BAD_REQUEST"}))
    with pytest.raises(http.BadAnswer, match=r"POST /workers http://127.0.0.1:31001: HTTP 400"):
        gateway(script).add(B, timeout_s=30)


def test_remove_deletes_by_id_and_returns_once_not_routable() -> None:
    accepted = {"status": "accepted", "worker_id": ID_A, "message": "Worker removal queued for background processing"}
    script = Script(("GET", "/workers", *listing(info(ID_A, A), info(ID_B, B))), ("DELETE", f"/workers/{ID_A}", 202,
                    accepted), ("GET", "/workers", *listing(info(ID_A, A), info(ID_B, B))),
                    ("GET", "/workers", *listing(info(ID_A, A, "draining"), info(ID_B, B))))
    assert gateway(script).remove(A, timeout_s=30) is True and script.steps == []


def test_remove_of_an_absent_worker_is_a_no_op_and_a_stuck_one_times_out() -> None:
    assert gateway(Script(("GET", "/workers", *listing(info(ID_B, B))))).remove(A, timeout_s=30) is False
    script = Script(("GET", "/workers", *listing(info(ID_A, A))), ("DELETE", f"/workers/{ID_A}", 202, {}),
                    *[("GET", "/workers", *listing(info(ID_A, A)))] * 3)
    with pytest.raises(InfraError, match=r"http://127.0.0.1:31000 still routable after DELETE after 1s"):
        gateway(script).remove(A, timeout_s=1)


def test_an_answer_that_is_not_smgs_is_a_bad_answer() -> None:
    with pytest.raises(http.BadAnswer, match=r"GET /workers: not JSON: b'<html>'"):
        gateway(Script(("GET", "/workers", 200, b"<html>"))).workers()
    with pytest.raises(http.BadAnswer, match=r"GET /workers: HTTP 503"):
        gateway(Script(("GET", "/workers", 503, {}))).workers()


METRICS = b"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="sim/model",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 3.0
sglang:num_queue_reqs{model_name="sim/model",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 2.0
"""


def test_worker_in_flight_counts_running_and_queued() -> None:
    def send(method: str, url: str, **_: Any) -> http.Reply:
        assert (method, url) == ("GET", A + "/metrics")
        return http.Reply(200, METRICS, {})

    def refused(method: str, url: str, **_: Any) -> http.Reply:
        raise http.NoAnswer(method, url, "[Errno 111] Connection refused")

    assert worker_in_flight(A + "/", send=send) == 5.0
    assert worker_in_flight(A, send=refused) is None
    assert worker_in_flight(A, send=lambda m, u, **_: http.Reply(404, b"", {})) is None


def test_drain_takes_the_worker_out_then_waits_until_it_is_quiet() -> None:
    clock = FakeClock()
    gw = FakeGateway(clock.pace(), request_s=3.0).start(A, B)
    assert [gw.send() for _ in range(4)] == [A, B, A, B]
    done = drain(gw, A, in_flight=lambda: gw.in_flight_of(A), timeout_s=10, pace=clock.pace(0.5))
    assert done == Drained(A, True, 0.0, 3.5, "out of the gateway, nothing in flight")
    assert [w.url for w in gw.workers()] == [B] and gw.calls == [f"remove {A}"]
    assert (gw.send(), gw.failed) == (B, 0)


def test_drain_is_bounded_and_says_what_is_left() -> None:
    clock = FakeClock()
    gw = FakeGateway(clock.pace(), request_s=100.0).start(A)
    gw.send()
    assert drain(gw, A, in_flight=lambda: gw.in_flight_of(A), timeout_s=2, pace=clock.pace(0.5)) == Drained(
        A, False, 1.0, 2.0, "out of the gateway, but 1 request(s) still in flight after 2s")
    assert drain(gw, A, in_flight=lambda: None, timeout_s=1, pace=clock.pace(0.5)) == Drained(
        A, False, None, 1.0, "out of the gateway, but its /metrics unreadable after 1s")


def test_fake_counts_a_request_with_no_worker_as_failed_and_joins_after_a_probe() -> None:
    clock = FakeClock()
    gw = FakeGateway(clock.pace(0.5), join_s=1.0, down={B})
    assert (gw.send(), gw.failed, gw.sent) == (None, 1, 1)
    assert gw.add(A, timeout_s=5).url == A and clock.now == 1.0
    with pytest.raises(InfraError, match=r"http://127.0.0.1:31001 not ready after 3s"):
        gw.add(B, timeout_s=3)
    assert (gw.remove(B, timeout_s=1), gw.in_flight_of(B)) == (False, None)


def test_the_fake_keeps_the_contract_the_real_gateway_keeps() -> None:
    clock = FakeClock()
    gw = FakeGateway(clock.pace(0.5), join_s=1.0).start(A)
    worker_api_contract(gw, A, B, timeout_s=5)
    assert gw.calls == [f"add {B}", f"add {B}", f"remove {A}", f"remove {A}", f"add {A}"]


class Headers(Script):
    """Script that also keeps the headers of each call."""

    def __init__(self, *steps: tuple[str, str, int, Any]) -> None:
        super().__init__(*steps)
        self.headers: list[dict[str, str]] = []

    def __call__(self, method: str, url: str, *, body: bytes | None = None, headers: Any = None,
                 timeout: float = 0) -> http.Reply:
        self.headers.append(dict(headers or {}))
        return super().__call__(method, url, body=body, headers=headers, timeout=timeout)


def test_every_call_carries_the_control_plane_key_and_a_refusal_names_no_key() -> None:
    script = Headers(("GET", "/workers", *listing(info(ID_A, A))),
                     ("DELETE", f"/workers/{ID_A}", 401, b"Invalid authentication token"))
    gw = HttpGateway(GW, send=script, pace=FakeClock().pace(0.5), key="k3y-abc")
    assert "k3y-abc" not in repr(gw)
    with pytest.raises(Unauthorized) as err:
        gw.remove(A, timeout_s=5)
    assert script.headers == [{"Authorization": "Bearer k3y-abc"}] * 2
    assert str(err.value) == (
        "gateway http://127.0.0.1:30080: DELETE /workers/" + ID_A + ": HTTP 401: it does not take stackbuild's "
        "control-plane key; redeploy the stack so its unit runs with the key file stackbuild keeps on its host")
    # an open gateway's client sends none
    open_script = Headers(("GET", "/workers", *listing()))
    HttpGateway(GW, send=open_script).workers()
    assert open_script.headers == [{}]


def test_the_fake_gateway_refuses_a_caller_without_its_key_as_smg_does() -> None:
    clock = FakeClock()
    fake = FakeGateway(clock.pace(), key="the-key").start(A)
    for caller in (fake.client(None), fake.client("another")):
        with pytest.raises(Unauthorized):
            caller.workers()
        with pytest.raises(Unauthorized):
            caller.add(B, timeout_s=5)
        with pytest.raises(Unauthorized):
            caller.remove(A, timeout_s=5)
    assert (fake.refusals, fake.calls, [w.url for w in fake.workers()]) == (6, [], [A])
    worker_api_contract(fake.client("the-key"), A, B, timeout_s=5)
    assert fake.refusals == 6
