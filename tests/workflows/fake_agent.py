"""A stand-in node agent for workflow tests: the same activity names as the real one, with
engines that are just records the test can inspect and kill."""

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.contracts import (
    DiscoverRequest,
    EngineExit,
    EngineInstallRequest,
    EngineLoad,
    EngineLoadReport,
    EngineLoadRequest,
    EngineState,
    EngineStatus,
    FetchArtifactRequest,
    FetchArtifactResult,
    FetchProgressReport,
    KvSource,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    NodeWatch,
    NodeWatchReport,
    PortsInUse,
    ReadyRequest,
    ReadyResult,
    SetAdaptersRequest,
    SetAdaptersResult,
    ShardRef,
    StopResult,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.names import NodeActivity

_pids = itertools.count(1000)


@dataclass
class FakeEngine:
    pid: int
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None


class FakeAgent:
    def __init__(self, node: str) -> None:
        self.node = node
        self.engines: dict[str, FakeEngine] = {}
        self.launches: list[str] = []
        # When each launch happened (time.monotonic()), to tell which node started first.
        self.launch_times: list[float] = []
        self.stops: list[str] = []
        self.installs: list[EngineInstallRequest] = []
        self.install_result = EngineState.INSTALLED
        # What the install reports beside its result; None: the usual line for that result.
        self.install_detail: str | None = None
        # What discovery finds when a schedule asks the node to look again.
        self.inventory = NodeInventory(name=node, cpu_cores=8, memory_mb=16384)
        self.discoveries = 0
        # engine -> the reason re-verification fails it from now on.
        self.broken: dict[str, str] = {}
        self.verifications = 0
        # True: re-verification never answers, as when the agent dies during it.
        self.verification_hangs = False
        # replica id -> what its engine's metrics say (default: idle).
        self.loads: dict[str, EngineLoad] = {}
        # True: every engine this agent starts exits at once (a crash loop), with this reason.
        self.crash_on_start = False
        # What each launch reports of the engine's KV-cache events (None: it publishes none).
        self.kv: KvSource | None = None
        self.crash_reason = "engine exited"
        # Ports a program outside llmgw holds on this node: a launch there is refused.
        self.foreign_ports: set[int] = set()
        # Ports launches were asked for, in order.
        self.launch_ports: list[int] = []
        # Artifacts fetched from the mirror, in order; the ones this node holds.
        self.fetches: list[str] = []
        self.artifacts: set[str] = set()
        # Set: a fetch waits for it (a large download); a fetch's failure, when given.
        self.fetch_gate: asyncio.Event | None = None
        # Set: each load report waits for it (the model is looking); load_asked says it is.
        self.load_gate: asyncio.Event | None = None
        self.load_asked = asyncio.Event()
        self.fetch_error: ApplicationError | None = None
        # What a gated fetch heartbeats.
        self.fetch_progress = FetchProgressReport(
            done=3 << 30, total=8 << 30, current="model.gguf", note="fetching"
        )
        # replica id -> the adapters its engine serves (name -> path): those it was launched
        # with, then those set at runtime; each runtime call, in order; its failure, if given.
        self.adapters: dict[str, dict[str, str]] = {}
        self.adapter_calls: list[SetAdaptersRequest] = []
        self.adapters_error: ApplicationError | None = None
        # The liveness watch. silent: the agent holds it without a word, as a hung or cut-off
        # agent would; stopping: it returns saying so, as an agent told to stop does. beats:
        # heartbeats sent, the latest of which is each heartbeat's details. A watch taken once
        # the agent said it stops is held until its worker shuts down.
        self.boot_id = "boot-1"
        self.silent = False
        # crashed: a silent watch ignores its cancellation for crash_linger_s, so that its
        # worker's shutdown stops taking tasks at once but tells Temporal nothing, as a killed
        # process would.
        self.crashed = False
        self.crash_linger_s = 4.0
        self.stopping = False
        self.stop_told = False
        # Set: every watch fails at once with it (a broken agent).
        self.watch_error: ApplicationError | None = None
        self.beats = 0
        self.watches = 0
        # The latest watch asked for, and how many this agent holds now.
        self.last_watch: NodeWatch | None = None
        self.holding = 0

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.install,
            self.start,
            self.wait_ready,
            self.supervise,
            self.stop,
            self.discover,
            self.verify_engines,
            self.engine_load,
            self.fetch_artifact,
            self.set_adapters,
            self.watch,
        ]

    @activity.defn(name=NodeActivity.WATCH_LIVENESS)
    async def watch(self, req: NodeWatch) -> NodeWatchReport:
        self.watches += 1
        self.last_watch = req
        if self.watch_error is not None:
            raise self.watch_error
        self.holding += 1
        try:
            return await self._hold(req)
        finally:
            self.holding -= 1

    async def _hold(self, req: NodeWatch) -> NodeWatchReport:
        timeout = activity.info().heartbeat_timeout
        every = min(0.2, timeout.total_seconds() / 4) if timeout else 0.2
        deadline = time.monotonic() + req.report_after_s
        while True:
            if not self.silent:
                self.beats += 1
                activity.heartbeat(self.beats)
                if self.stopping and not self.stop_told:  # said once, as the real agent does
                    self.stop_told = True
                    return NodeWatchReport(boot_id=self.boot_id, stopping=True)
                digest = self.inventory.digest()
                if req.inventory_digest and digest != req.inventory_digest:
                    return NodeWatchReport(boot_id=self.boot_id, inventory=self.inventory)
                if time.monotonic() >= deadline:
                    return NodeWatchReport(boot_id=self.boot_id)
            try:
                await asyncio.sleep(every)
            except asyncio.CancelledError:
                if self.silent and self.crashed:
                    await asyncio.sleep(self.crash_linger_s)
                raise

    def kill(self, replica_id: str, code: int = -9) -> None:
        engine = self.engines[replica_id]
        engine.exit_code = code
        engine.exited.set()

    def vanish(self, replica_id: str) -> None:
        """The engine dies while nobody watches (its agent was down): supervise never hears."""
        del self.engines[replica_id]

    def running(self) -> list[str]:
        return [r for r, e in self.engines.items() if not e.exited.is_set()]

    @activity.defn(name=NodeActivity.INSTALL_ENGINE)
    async def install(self, req: EngineInstallRequest) -> EngineStatus:
        self.installs.append(req)
        activity.heartbeat("building llama-server 50%")
        installed = self.install_result == EngineState.INSTALLED
        detail = self.install_detail
        if detail is None:
            detail = "version: 1 (fake)" if installed else "cmake: compiler not found (fake)"
        return EngineStatus(
            engine=req.requirement.engine,
            version=req.requirement.version,
            state=self.install_result,
            path="/engines/llama-server" if installed else None,
            detail=detail,
        )

    @activity.defn(name=NodeActivity.DISCOVER)
    async def discover(self, req: DiscoverRequest) -> NodeInventory:
        self.discoveries += 1
        return self.inventory

    @activity.defn(name=NodeActivity.VERIFY_ENGINES)
    async def verify_engines(self, req: VerifyEnginesRequest) -> VerifyEnginesResult:
        self.verifications += 1
        if self.verification_hangs:
            await asyncio.Event().wait()  # until the worker stops
        checked = []
        for status in req.engines:
            if status.engine in self.broken:
                status = status.model_copy(
                    update={"state": EngineState.FAILED, "detail": self.broken[status.engine]}
                )
            else:  # as the real agent: a failed engine that runs again is installed again
                status = status.model_copy(update={"state": EngineState.INSTALLED})
            checked.append(status.model_copy(update={"verified_at": "2026-11-30T12:00:00+00:00"}))
        return VerifyEnginesResult(engines=checked)

    @activity.defn(name=NodeActivity.ENGINE_LOAD)
    async def engine_load(self, req: EngineLoadRequest) -> EngineLoadReport:
        self.load_asked.set()
        if self.load_gate is not None:
            await self.load_gate.wait()
        return EngineLoadReport(
            engines=[
                self.loads.get(r, EngineLoad(replica_id=r)).model_copy(update={"replica_id": r})
                for r in req.replica_ids
            ]
        )

    @activity.defn(name=NodeActivity.FETCH_ARTIFACT)
    async def fetch_artifact(self, req: FetchArtifactRequest) -> FetchArtifactResult:
        self.fetches.append(req.manifest)
        gate = self.fetch_gate
        while gate is not None and not gate.is_set():
            # As the real agent does: a line for the UI, then the numbers.
            activity.heartbeat(self.fetch_progress.note, self.fetch_progress)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gate.wait(), 0.2)
        if self.fetch_error is not None:
            raise self.fetch_error
        reused = req.manifest in self.artifacts
        self.artifacts.add(req.manifest)
        return FetchArtifactResult(path=f"/artifacts/{req.manifest}", reused=reused)

    @activity.defn(name=NodeActivity.START_ENGINE)
    async def start(self, req: LaunchRequest) -> LaunchResult:
        port = next(s.port for s in req.allocation.shards_or_leader() if s.node == self.node)
        self.launch_ports.append(port)
        if port in self.foreign_ports:
            raise ApplicationError(
                f"port {port} on node {self.node} is in use by another process",
                PortsInUse(node=self.node, ports=[port]).model_dump(),
                type="PortInUse",
                non_retryable=True,
            )
        profile = req.model.profiles[req.allocation.profile_index]
        wanted = [req.model.artifact, *(a.artifact for a in profile.lora)]
        missing = [a for a in wanted if a and a not in self.artifacts]
        if missing:
            raise ApplicationError(
                f"artifact {missing[0]} is not fetched on node {self.node}",
                type="WeightsMissing",
                non_retryable=True,
            )
        current = self.engines.get(req.replica_id)
        if current is not None and not current.exited.is_set():
            return LaunchResult(pid=current.pid, adopted=True, command=["llama-server"], kv=self.kv)
        self.launches.append(req.replica_id)
        self.launch_times.append(time.monotonic())
        self.adapters[req.replica_id] = {a.name: a.path for a in profile.lora}
        engine = FakeEngine(pid=next(_pids))
        self.engines[req.replica_id] = engine
        if self.crash_on_start:
            engine.exit_code = 1
            engine.exited.set()
        return LaunchResult(pid=engine.pid, adopted=False, command=["llama-server"], kv=self.kv)

    @activity.defn(name=NodeActivity.SET_ADAPTERS)
    async def set_adapters(self, req: SetAdaptersRequest) -> SetAdaptersResult:
        self.adapter_calls.append(req)
        if self.adapters_error is not None:
            raise self.adapters_error
        wanted_artifacts = [a.artifact for a in req.adapters if a.artifact]
        missing = [a for a in wanted_artifacts if a not in self.artifacts]
        if missing:
            raise ApplicationError(
                f"artifact {missing[0]} is not fetched on node {self.node}",
                type="WeightsMissing",
                non_retryable=True,
            )
        served = self.adapters.get(req.replica_id, {})
        wanted = {a.name: a.path for a in req.adapters}
        self.adapters[req.replica_id] = wanted
        return SetAdaptersResult(
            adapters=wanted,
            loaded=[n for n, p in wanted.items() if served.get(n) != p],
            unloaded=[n for n, p in served.items() if wanted.get(n) != p],
        )

    @activity.defn(name=NodeActivity.WAIT_READY)
    async def wait_ready(self, req: ReadyRequest) -> ReadyResult:
        return ReadyResult(ready=True, detail="ok")

    @activity.defn(name=NodeActivity.SUPERVISE_ENGINE)
    async def supervise(self, ref: ShardRef) -> EngineExit:
        engine = self.engines[ref.replica_id]
        while not engine.exited.is_set():
            activity.heartbeat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.exited.wait(), 0.2)
        return EngineExit(
            replica_id=ref.replica_id, exit_code=engine.exit_code, reason=self.crash_reason
        )

    @activity.defn(name=NodeActivity.STOP_ENGINE)
    async def stop(self, ref: ShardRef) -> StopResult:
        self.stops.append(ref.replica_id)
        engine = self.engines.get(ref.replica_id)
        was_running = engine is not None and not engine.exited.is_set()
        if engine is not None:
            engine.exit_code = 0
            engine.exited.set()
        return StopResult(replica_id=ref.replica_id, was_running=was_running)
