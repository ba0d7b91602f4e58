"""What access control reports at scrape time: admission queues per tier and lane, and
whether per-key limits are being counted in Redis."""

from __future__ import annotations

from prometheus_client.registry import Collector

from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.limits import Limiter


class AdmissionCollector(Collector):
    """Admission queue depth and in-flight per tier, and where limits are being counted."""

    def __init__(self, admission: Admission, limiter: Limiter) -> None:
        self._admission = admission
        self._limiter = limiter

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily(
            "tiergate_admission_queue_depth", "Requests waiting for a slot", labels=["tier", "lane"]
        )
        active = GaugeMetricFamily(
            "tiergate_admission_in_flight", "Requests holding a slot", labels=["tier", "lane"]
        )
        for lane, gates in (
            ("all", self._admission.tiers),
            ("long", self._admission.long),
            ("flex", self._admission.flex),
        ):
            for tier, gate in gates.items():
                depth.add_metric([tier.value, lane], float(gate.queued))
                active.add_metric([tier.value, lane], float(gate.active))
        for tier, patient in self._admission.patient.items():
            depth.add_metric([tier.value, "patient"], float(patient.gate.queued))
            active.add_metric([tier.value, "patient"], float(patient.gate.active))
        yield depth
        yield active
        limit = GaugeMetricFamily(
            "tiergate_patient_lane_limit",
            "Patient requests (flex, agent jobs' calls) that may hold a slot now: set from "
            "interactive streams' time per output token (admission.patient)",
            labels=["tier"],
        )
        slowdown = GaugeMetricFamily(
            "tiergate_patient_lane_slowdown",
            "Interactive streams' median time per output token over its reference, as the "
            "patient lane's limit last saw it",
            labels=["tier"],
        )
        for tier, patient in self._admission.patient.items():
            limit.add_metric([tier.value], float(patient.limit))
            if patient.slowdown is not None:
                slowdown.add_metric([tier.value], patient.slowdown)
        yield limit
        yield slowdown
        flow = GaugeMetricFamily(
            "tiergate_admission_limit",
            "Requests a tier's gate hands its engines at once now: set from interactive "
            "streams' time per output token (admission.flow), at most its max_concurrent",
            labels=["tier"],
        )
        for tier, gate in self._admission.tiers.items():
            flow.add_metric([tier.value], float(gate.capacity))
        yield flow
        flow_slowdown = GaugeMetricFamily(
            "tiergate_admission_slowdown",
            "Interactive streams' median time per output token over its reference, as a "
            "tier's flow control last saw it",
            labels=["tier"],
        )
        for tier, control in self._admission.flow.items():
            if control.slowdown is not None:
                flow_slowdown.add_metric([tier.value], control.slowdown)
        yield flow_slowdown
        if self._limiter.configured_redis:
            yield GaugeMetricFamily(
                "tiergate_ratelimit_redis_up",
                "1 while per-key limits are counted in Redis; 0 while this replica counts "
                "them alone because Redis is unreachable",
                value=1.0 if self._limiter.shared else 0.0,
            )
