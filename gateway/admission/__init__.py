"""Admission: which requests go to the engines now and which wait, fairly, in the gateway."""

from gateway.admission.depths import ReplicaDepths
from gateway.admission.fair_queue import FairQueue, QueueFull, Ticket
from gateway.admission.gate import AdmissionGate, Pass, QueuePolicy

__all__ = [
    "AdmissionGate",
    "FairQueue",
    "Pass",
    "QueueFull",
    "QueuePolicy",
    "ReplicaDepths",
    "Ticket",
]
