"""Elastic mode (``KVPLAN_MODE=elastic``) as the pipeline sees it: one :class:`ElasticMode`,
made when the plugin starts, holds this process's elastic state and defines the handlers of
the adapters' ``elastic`` targets.

Engine-core process: ``generate_scheduler_kv_cache_config`` keeps every rank's config
(:meth:`ElasticMode.record_rank_configs`); ``Scheduler.__init__`` plans rank 0's config, builds
the ledger and makes the block pool elastic (:meth:`ElasticMode.scheduler_init`);
``Scheduler.schedule`` gives memory back before and attaches the step's operations after;
``Scheduler.update_from_output`` turns a failed map into preemptions. Worker processes: the
binding maps the null block and attaches a worker side (:meth:`ElasticMode.bind`,
:meth:`ElasticMode.attach`); ``Worker.execute_model`` applies each step's operations first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic import _group as group
from kvplan.integrations.vllm.elastic import _reclaim as reclaim
from kvplan.integrations.vllm.elastic import _recovery as recovery
from kvplan.integrations.vllm.elastic import _refusals as refusals
from kvplan.integrations.vllm.elastic import _unservable as unservable
from kvplan.integrations.vllm.elastic import _worker as worker_state
from kvplan.integrations.vllm.elastic._capacity import cpu_capacity, gpu_capacity, request_memory
from kvplan.integrations.vllm.elastic._ops import OPS_ATTR, SEQ_ATTR, MapFailed, geometry_digest
from kvplan.integrations.vllm.elastic._pool import make_elastic, side_of
from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide
from kvplan.integrations.vllm.elastic._settings import (
    ElasticSettings,
    default_limits,
    elastic_chunk_bytes,
    read_elastic_settings,
)
from kvplan.integrations.vllm.pipeline import Call, Handler, Runtime, plan_step
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.elastic.group import GroupMember
    from kvplan.elastic.ledger import Ledger
    from kvplan.executor import BoundKVCache
    from kvplan.integrations.vllm.pipeline.settings import Settings
    from kvplan.integrations.vllm.versions import Target, VersionAdapter
    from kvplan.schemas.plan import BindingPlan

logger = logging.getLogger("vllm.kvplan")


class ElasticMode:
    """Physical memory follows the blocks vLLM uses (``docs/elastic.md``)."""

    name = "elastic"

    def __init__(
        self, settings: ElasticSettings, *, backend: str, dump_dir: Path | None = None
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.dump_dir = dump_dir
        self.rank_configs: list[Any] = []
        """Engine core: every rank's ``KVCacheConfig`` (for the scheduler's plan)."""
        self.vllm_config: Any = None
        """Engine core: the config the engine's KV caches are being sized for."""
        self.member: GroupMember | None = None
        """Engine core: this engine's membership of ``KVPLAN_GROUP`` (joined once sized)."""
        self.workers: list[worker_state.WorkerSide] = []
        """Worker: the elastic caches this process bound (closed when the engine shuts down)."""
        self.engine_core: Any = None
        """Engine core: the ``EngineCore`` being built (its executor reaches the workers)."""
        self.watchers: list[reclaim.Watcher] = []
        """Engine core: the threads that give memory back while vLLM does not step."""
        self.reports = 0
        """Worker: how many of its sides hold a failed map's report for the next output (none:
        the step's output handlers have nothing to carry, see :meth:`_hold_report`)."""

    @classmethod
    def from_environment(
        cls, env: Mapping[str, str], settings: Settings
    ) -> tuple[ElasticMode, list[Diagnostic]]:
        """The mode with its settings read from ``env``, and every problem with them
        (a backend that commits all memory up front cannot run it)."""
        from kvplan.executor.backends import backend_info, backend_names

        elastic, problems = read_elastic_settings(env)
        if not backend_info(settings.backend).elastic:
            able = [n for n in backend_names(plugin=True) if backend_info(n).elastic]
            problems.append(
                error(
                    Code.INTEGRATION,
                    "KVPLAN_MODE",
                    f"the {settings.backend} backend commits all memory up front and cannot run "
                    "elastic mode.",
                    f"set KVPLAN_BACKEND to one of {', '.join(able)}, or KVPLAN_MODE=eager",
                )
            )
        return cls(elastic, backend=settings.backend, dump_dir=settings.dump_dir), problems

    # -- the Mode protocol ----------------------------------------------------------------

    def wraps(self, target: Target) -> bool:
        return True

    def check(self, adapter: VersionAdapter, version: str) -> list[Diagnostic]:
        if adapter.elastic:
            return []
        return [
            refusals.elastic_unsupported(
                f"vLLM {version} ({adapter.name}) is served in eager mode only; kvplan declares "
                "no elastic targets for it (docs/elastic.md lists the releases)"
            )
        ]

    def handlers(self) -> Mapping[str, Handler]:
        return {
            "elastic/capacity-cpu": lambda runtime, call: cpu_capacity(
                self.settings, runtime, call
            ),
            "elastic/capacity-gpu": lambda runtime, call: gpu_capacity(
                self.settings, runtime, call
            ),
            "elastic/request-memory": request_memory,
            "elastic/executor-init": self.executor_init,
            "elastic/initialize-kv-caches": self.initialize_kv_caches,
            "elastic/shutdown": self.shutdown,
            "elastic/engine-processes-shutdown": lambda runtime, call: group.stop_engine_processes(
                self.settings, self.dump_dir, call
            ),
            "elastic/rank-configs": self.record_rank_configs,
            "elastic/scheduler-init": self.scheduler_init,
            "elastic/schedule": self.schedule,
            "elastic/update-from-output": self.update_from_output,
            "elastic/sample-tokens": self.sample_tokens,
            "elastic/client-request": self.client_request,
        }

    def bind(self, plan: BindingPlan, *, backend: str, device: str) -> BoundKVCache:
        from kvplan.executor import apply
        from kvplan.executor.backends import backend_info

        # pages committed when mapped (as cuMemCreate commits them): the forward that first
        # writes a block takes no page faults, and a block mapped ahead is ready
        lazy = {"populate": True} if backend_info(backend).lazy_pages else {}
        cache = apply(
            plan,
            backend=backend,
            device=device,
            mode="elastic",
            chunk_size=elastic_chunk_bytes(backend),
            unbacked="fault" if self.settings.poison else "scratch",
            **lazy,
        )
        try:
            # Block 0 is vLLM's null block: padding and dummy runs read it, it stays backed.
            # Every other block is mapped when a step first uses it.
            cache.ensure_mapped([0])
        except BaseException:
            cache.close()
            raise
        return cache

    def attach(self, cache: BoundKVCache, owner: Any, label: str) -> Callable[[], None] | None:
        side = worker_state.worker_side(
            cache, self.settings, dump_dir=self.dump_dir, backend=self.backend, label=label
        )
        if self.settings.group is not None:
            side.group_member = group.member_name(self.dump_dir)
        lease = group.attach_worker(self.settings, side.group_member or "")
        worker_state.attach_worker(owner, side)
        self.workers.append(side)

        def closed() -> None:
            worker_state.detach_cache(cache)  # the last stats snapshot
            if side in self.workers:
                self.workers.remove(side)
            if lease is not None:
                group.close_quietly(lease)  # unmapped: this process no longer keeps it alive

        return closed

    def describe(self) -> dict[str, Any]:
        return self.settings.as_dict()

    # -- handlers of the adapters' elastic targets ----------------------------------------

    def executor_init(self, runtime: Runtime, call: Call) -> Any:
        """``Executor.__init__``: refuse what the engine's config alone rules out (``KVP548``:
        an engine on several nodes in a group) before vLLM starts a worker. Refused after the
        model loaded, vLLM had to stop workers on two nodes from a failed start-up, which did
        not always return (a CI run hung there)."""
        try:
            group.check_one_host(self.settings, group.nodes_of(call.argument("vllm_config")))
        except KVPlanError as exc:
            raise runtime.refuse(exc) from None
        return call.run()

    def initialize_kv_caches(self, runtime: Runtime, call: Call) -> Any:
        """``EngineCore._initialize_kv_caches(vllm_config)``: the config the next handler needs
        to check the floor."""
        self.vllm_config = call.arguments["vllm_config"]
        self.engine_core = call.arguments["self"]
        try:
            return call.run()
        finally:
            self.vllm_config = None

    def record_rank_configs(self, runtime: Runtime, call: Call) -> Any:
        """``generate_scheduler_kv_cache_config(kv_cache_configs)``: keep every rank's config,
        and refuse a memory limit below the floor now — before any worker allocates its KV
        cache or vLLM compiles and warms the model up (``KVP533``)."""
        self.rank_configs = list(call.arguments["kv_cache_configs"])
        if self.rank_configs and self.vllm_config is not None:
            config = self.rank_configs[0]
            if config.kv_cache_tensors:
                try:
                    ledger = scheduler_ledger(runtime, config)
                    ledger.back([0])
                    floor = engine_floor(ledger, config, self.vllm_config)
                    limit = default_limits(self.settings, ledger.reserved_bytes)[0]
                    if limit < floor:
                        raise refusals.elastic_limit_too_small(limit, floor)
                    self.join_group(ledger, floor, self.vllm_config)
                except KVPlanError as exc:
                    raise runtime.refuse(exc) from None
        return call.run()

    def join_group(self, ledger: Ledger, floor: int, vllm_config: Any) -> None:
        """Join ``KVPLAN_GROUP`` (once): before any worker maps its null block. (An engine
        on several nodes never gets here: :meth:`executor_init` refused it.)"""
        if self.settings.group is None or self.member is not None:
            return
        world = int(getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1) or 1)
        self.member = group.join(
            self.settings,
            name=group.member_name(self.dump_dir),
            floor=floor,
            ceiling=ledger.reserved_bytes,
            initial=ledger.mapped_bytes,
            factor=group.charge_factor(self.backend, world),
        )

    def scheduler_init(self, runtime: Runtime, call: Call) -> Any:
        """``Scheduler.__init__``: build the ledger and make the block pool elastic."""
        result = call.run()
        scheduler = call.arguments["self"]
        configs = self.rank_configs or [call.arguments["kv_cache_config"]]
        manager = getattr(scheduler, "kv_cache_manager", None)
        pool = getattr(manager, "block_pool", None)
        if pool is None or not hasattr(pool, "free_block_queue"):
            no_pool = refusals.elastic_unsupported("the scheduler has no block pool")
            raise runtime.refuse(KVPlanError(no_pool))
        if not configs[0].kv_cache_tensors:
            return result
        try:
            ledgers = [scheduler_ledger(runtime, config) for config in configs]
            if len({geometry_digest(ledger) for ledger in ledgers}) > 1:
                raise KVPlanError(
                    refusals.elastic_unsupported(
                        "the ranks' KV caches have different block geometry (pipeline "
                        "stages whose layers take other bytes per block); elastic serving "
                        "needs one"
                    )
                )
            ledger = ledgers[0]
            if ledger.num_blocks != pool.num_gpu_blocks:
                raise KVPlanError(
                    refusals.elastic_unsupported(
                        f"the plan has {ledger.num_blocks} blocks, the block pool "
                        f"{pool.num_gpu_blocks}"
                    )
                )
            ahead = self.settings.maps_ahead_busy(self.backend)
            side = SchedulerSide(ledger, self.settings, pool, self.dump_dir, busy_ahead=ahead)
            side.floor = engine_floor(ledger, configs[0], call.arguments["vllm_config"])
            if side.limit < side.floor:
                raise refusals.elastic_limit_too_small(side.limit, side.floor)
            self.join_group(ledger, side.floor, call.arguments["vllm_config"])
            side.group = self.member
        except KVPlanError as exc:
            raise runtime.refuse(exc) from None
        make_elastic(pool, side)
        if self.engine_core is not None and hasattr(self.engine_core, "model_executor"):
            watcher = reclaim.Watcher(self.engine_core, scheduler, side)
            side.watcher = watcher
            self.watchers.append(watcher)
            watcher.start()
        logger.info(
            "kvplan: elastic block pool: %d blocks, %d bytes reserved, limit %d, cache limit "
            "%d, reserve %d, chunk %d bytes; a busy engine's next blocks mapped %s",
            ledger.num_blocks, ledger.reserved_bytes, side.limit, side.cache_limit,
            side.reserve, ledger.chunk_bytes,
            "ahead, beside the step" if side.busy_ahead else "in the step that takes them",
        )  # fmt: skip
        return result

    def schedule(self, runtime: Runtime, call: Call) -> Any:
        """``Scheduler.schedule``: give memory back, schedule, attach the step's operations."""
        scheduler = call.argument("self")
        side = side_of(scheduler)
        if side is None:
            return call.run()
        with side.lock:
            side.before_schedule(scheduler)
            output = call.run()
            side.stepping = True  # until its output arrives (``update_from_output``)
            side.unservable_ids = unservable.pick(scheduler, side, output)
            if side.step_taken() and side.busy:  # blocks went: back what the next step takes,
                side.map_ahead_busy()  # mapped while this one computes (where the backend can)
            ops = side.ops()
            if ops is not None:
                setattr(output, OPS_ATTR, ops)
            setattr(output, SEQ_ATTR, side.seq)  # the operations sent so far: this step's
            return output  # output confirms them (``update_from_output``)

    def update_from_output(self, runtime: Runtime, call: Call) -> Any:
        """``Scheduler.update_from_output``: a step whose maps failed becomes out of blocks."""
        scheduler = call.argument("self")
        side = side_of(scheduler)
        output = call.argument("scheduler_output")
        if side is None:
            return call.run()
        with side.lock:
            side.stepping = False
            ops = getattr(output, OPS_ATTR, None)
            if ops is not None:
                report = recovery.report_of(call.argument("model_runner_output"))
                if report is not None and report.seq == ops.seq:
                    recovery.recover_failed_map(scheduler, side, report.failure())
            result = call.run()
            if side.unservable_ids:
                ids, side.unservable_ids = side.unservable_ids, []
                result = unservable.finish(scheduler, side, ids, result)
            if not side.quiet.is_set():
                unfinished = getattr(scheduler, "get_num_unfinished_requests", None)
                if unfinished is None or not unfinished():
                    side.quiet.set()  # the watcher looks again (``_reclaim``)
            seq = getattr(output, SEQ_ATTR, None)
            if seq is not None and (side.group is not None or side.unconfirmed):
                # idle matters to a group member only (``confirm``)
                has_requests = getattr(scheduler, "has_requests", None)
                idle = side.group is not None and callable(has_requests) and not has_requests()
                side.confirm(seq, idle=idle)
            return result

    def client_request(self, runtime: Runtime, call: Call) -> Any:
        """``EngineCoreProc._handle_client_request``: the busy loop took a request off its
        input queue; kvplan's own wake (``_reclaim.WAKE``) gives an idle engine's memory
        back on the loop's thread, everything else is vLLM's."""
        if call.argument("request_type") != reclaim.WAKE:
            return call.run()
        for watcher in self.watchers:
            if watcher.engine_core is call.argument("self"):
                watcher.handle()
        return None

    def shutdown(self, runtime: Runtime, call: Call) -> Any:
        """``EngineCore.shutdown``: the engine leaves its group once every rank's elastic cache
        is closed (unmapped), never before (unmap, then release: the grant never covers less
        than what is mapped). The workers are asked to close their caches first
        (:func:`group.close_workers`); then the engine leaves, and vLLM stops the workers --
        the OpenAI server's default shutdown kills them, and the engine core, seconds later at
        most. When the workers cannot be asked (gone already: Ctrl-C reached them too), the
        engine leaves after vLLM stopped them, as before."""
        for watcher in self.watchers:
            watcher.stop()
        self.watchers.clear()
        with group.signals_deferred():  # a stop signal now waits for the leave (< 1 s)
            if self.member is not None and group.close_workers(self.engine_core):
                self._close_here()
                self._leave()
        try:
            return call.run()
        finally:
            self._close_here()
            self._leave()

    def _close_here(self) -> None:
        """Close this process's elastic caches (an executor whose workers run in it)."""
        for side in list(self.workers):
            if not side.cache.closed:
                side.cache.close()
                worker_state.detach_cache(side.cache)
        self.workers.clear()

    def _leave(self) -> None:
        member, self.member = self.member, None
        if member is not None:
            try:
                member.leave()
            except KVPlanError as exc:
                logger.warning("kvplan: leaving the group failed: %s", exc)
            else:
                logger.info("kvplan: %s left group %s", member.name, self.settings.group)

    def before_step(self, runtime: Runtime, call: Call) -> None:
        """``Worker.execute_model``: unmap, then map, this step's blocks (vLLM runs it next)."""
        ops = getattr(call.argument("scheduler_output"), OPS_ATTR, None)
        if ops is None:
            return
        worker = call.argument("self")
        side = worker_state.worker_of(getattr(worker, "model_runner", None))
        if side is None:
            why = "this worker received elastic operations but bound no elastic KV cache"
            raise runtime.refuse(KVPlanError(refusals.elastic_unsupported(why)))
        # a report no output carried (a pipeline stage whose output never reaches the
        # scheduler) is dropped: the output rank carried the same one
        self._hold_report(side, None)
        failed: MapFailed | None = None
        try:
            side.apply(ops)
        except MapFailed as exc:
            failed = exc
        # every rank got the same ops (and the same ``ahead`` before them): all of them
        # agree, or none
        if side.step_blocks:  # it mapped, or joined a map ahead
            failed = recovery.agree_across_ranks(side, ops.seq, side.step_blocks, failed)
        side.start_ahead(ops.ahead)  # mapped on the worker's thread while the step runs
        if failed is None:
            return
        try:
            self._hold_report(side, recovery.report_failure(side, failed))
        except KVPlanError as exc:
            raise runtime.refuse(exc) from failed.error

    def after_step(self, runtime: Runtime, call: Call, result: Any) -> Any:
        """``Worker.execute_model`` returned: when it returned the step's output, that output
        carries a pending failed-map report to the scheduler (else ``sample_tokens`` does)."""
        if result is None or not self.reports:
            return result
        return self._carry_report(call.argument("self"), result)

    def sample_tokens(self, runtime: Runtime, call: Call) -> Any:
        """``Worker.sample_tokens``: the step's output (V1 runner: ``execute_model`` returned
        ``None``) carries a pending failed-map report to the scheduler."""
        output = call.run()
        if not self.reports:  # every step asks: one read when there is nothing to carry
            return output
        return self._carry_report(call.argument("self"), output)

    def _hold_report(self, side: worker_state.WorkerSide, report: Any) -> None:
        """``side``'s report for the next output is ``report`` (``None``: none), counted in
        :attr:`reports`."""
        self.reports += (report is not None) - (side.pending_report is not None)
        side.pending_report = report

    def _carry_report(self, worker: Any, output: Any) -> Any:
        side = worker_state.worker_of(getattr(worker, "model_runner", None))
        if side is None or side.pending_report is None or output is None:
            return output
        report = side.pending_report
        self._hold_report(side, None)
        return recovery.with_report(output, report)


def engine_floor(ledger: Ledger, config: Any, vllm_config: Any) -> int:
    """The engine's floor (:func:`kvplan.elastic.floor.floor_bytes`) for ``config``."""
    from kvplan.elastic.floor import floor_bytes
    from kvplan.integrations.vllm.convert import request_blocks

    return floor_bytes(ledger, request_blocks(config, vllm_config))


def scheduler_ledger(runtime: Runtime, config: Any) -> Ledger:
    """Plan ``config`` as the workers do and index its pages (sharers own no memory)."""
    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm.convert import capture

    document = capture(
        config,
        adapter=runtime.adapter,
        shared_kv_cache_layers={},
        metadata={"source": "kvplan vLLM plugin", "phase": "scheduler"},
    )
    plan, findings = plan_step(document, runtime.settings)
    findings.raise_for_errors(strict=plan is None)
    assert plan is not None
    chunk = elastic_chunk_bytes(runtime.settings.backend)
    return Ledger(plan, chunk, chunk)
