"""The one module that runs vLLM: a replica hosts one engine, served one of two ways.

- `VllmServer` (the default, `serving: openai-server`): vLLM's own OpenAI-compatible server in a child
  process, started from the same options a deployment's `vllm-serve.yaml` holds, on 127.0.0.1 and a
  free port; clients stream completions from it over HTTP (`trainables.http_replica`), so a trial
  measures what the deployed server does, HTTP frontend and detokenization included.
- `VllmEngine` (`serving: in-process`): an `AsyncLLM` in this process with token-id prompts and no
  detokenization; faster to measure, but it skips the server's frontend.

Both run inside a Ray actor (see `trainables.pool`), but nothing here depends on Ray, so they also run
in-process for tests and benchmarks. On a CPU-only host a replica claims whole cores for the engine's
threads (a lock file per core, released when the process dies), so replicas of concurrent trials never
share a core.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainables.protocol import Finished, FirstToken, GenerateRequest, StreamItem
from tuner.errors import EngineDied, EngineError
from tuner.processes import free_port
from tuner.tiny_model import engine_defaults
from tuner.vllm_args import serve_argv

_CORE_LOCK_DIR = Path(os.environ.get("VLLM_TUNER_CORE_LOCKS", "/tmp/vllm-tuner-cores"))


SERVINGS = ("openai-server", "in-process")
SERVED_MODEL_NAME = "measured"  # the name the trial's servers answer to


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to start one replica: vLLM engine arguments, how it is served, where on CPU."""

    engine_args: dict[str, Any]
    cpu_cores: int = 1
    on_cpu: bool = True
    env: dict[str, str] = field(default_factory=dict)
    serving: str = "in-process"

    @property
    def args(self) -> dict[str, Any]:
        """The engine arguments the replica starts with: `engine_args` over the model's own defaults (the
        tiny model runs in float32 on CPU: tuner.tiny_model.engine_defaults)."""
        return {**engine_defaults(self.engine_args.get("model"), self.on_cpu), **self.engine_args}


def claim_cores(count: int, lock_dir: Path = _CORE_LOCK_DIR) -> tuple[list[int], list[Any]]:
    """Lock `count` cores of this process's affinity set; returns the core ids and the held lock files.

    The locks are `flock`s, so they vanish with the process that holds them, however it dies.
    Raises EngineError when fewer than `count` cores are free.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    cores, handles = [], []
    for core in sorted(os.sched_getaffinity(0)):
        handle = open(lock_dir / f"core-{core}.lock", "w")
        if not _try_lock(handle):
            handle.close()
            continue
        cores.append(core)
        handles.append(handle)
        if len(cores) == count:
            return cores, handles
    for handle in handles:
        handle.close()
    raise EngineError(f"no {count} free CPU core(s) to bind the engine to (all claimed by other replicas)")


def _try_lock(handle: Any, tries: int = 4) -> bool:
    """Take the lock if no replica holds it. A held lock is tried again a few times, 20 ms apart: another
    replica's `claimed_cores` holds a free core's lock for an instant."""
    for attempt in range(tries):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt < tries - 1:
                time.sleep(0.02)
    return False


def engine_cpu_env(cores: list[int]) -> dict[str, str]:
    """Environment that keeps a CPU engine's threads to `cores`: one OpenMP thread per core (vLLM binds
    threads itself only for multiprocess workers, not the single-process executor a replica uses)."""
    return {"OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores)}


def claimed_cores(candidates: AbstractSet[int] | None = None, lock_dir: Path = _CORE_LOCK_DIR) -> set[int]:
    """The `candidates` (this process's cores by default) whose lock a replica holds (this one's included):
    a core whose lock can be taken for an instant is free."""
    claimed = set()
    for core in sorted(os.sched_getaffinity(0) if candidates is None else candidates):
        path = lock_dir / f"core-{core}.lock"
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # never claimed
        except OSError:  # unreadable: count it as taken rather than move onto it
            claimed.add(core)
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            claimed.add(core)
        else:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)
    return claimed


def other_cores(cores: list[int], allowed: set[int] | None = None, claimed: AbstractSet[int] = frozenset()) -> set[int]:
    """Where a replica's frontend (API server, detokenizer) works: `allowed` (this thread's cores by
    default) except `cores` and the cores other replicas' engines had claimed when it was placed (once, at
    start); `cores` themselves when nothing else is left. Not onto another engine's cores: two replicas
    on two cores, each frontend moved onto the other's engine, left one replica's first tokens 10 s late
    at 2.7 requests/s each (the other took the traffic), where each frontend beside its own engine served
    both in 0.06 s (TTFT p95)."""
    allowed = (os.sched_getaffinity(0) if allowed is None else allowed) | set(cores)
    return (allowed - set(cores) - set(claimed)) or set(cores)


def set_process_affinity(pid: int, cores: set[int] | list[int]) -> None:
    """Move every thread of process `pid` to `cores` (sched_setaffinity moves one thread only)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for thread in threads:
        try:
            os.sched_setaffinity(int(thread), set(cores))
        except OSError:  # a thread that just ended
            continue


def _terminate_with_parent() -> None:
    """In a child, before exec: receive SIGTERM when the parent (thread) that started it dies, so a server
    whose Ray actor was killed shuts its own engine down at once (a SIGKILL would orphan the engine)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the raylet's subreaper is the fallback
        pass


def start_pinned(argv: list[str], cores: list[int], *, env: dict[str, str], stdout: Any) -> subprocess.Popen:
    """Start `argv` in its own process group, on `cores` from its first instruction (so every process it
    spawns, vLLM's engine core included, starts there too)."""

    def pin() -> None:
        _terminate_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return subprocess.Popen(
        argv,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=pin,
    )


class VllmEngine:
    """One replica: a vLLM `AsyncLLM` with exact-length, token-id generation and client-side timing."""

    def __init__(self, spec: EngineSpec) -> None:
        self._spec = spec
        self._engine: Any = None
        self._core_locks: list[Any] = []
        self._log_path: Path | None = None
        self._host_affinity: set[int] | None = None
        self.info: dict[str, Any] = {}

    async def start(self) -> dict[str, Any]:
        """Build the engine; returns facts about it (pid, bound cores, start seconds).

        Raises EngineError with vLLM's own reason when the engine cannot start.
        """
        started = time.perf_counter()
        os.environ.update(self._spec.env)
        cores: list[int] = []
        allowed = os.sched_getaffinity(0)
        if self._spec.on_cpu:
            cores, self._core_locks = claim_cores(self._spec.cpu_cores)
            os.environ.update(engine_cpu_env(cores))
            self.info["cores"] = cores
            # The engine-core process vLLM spawns inherits the spawning thread's cores. This process is
            # moved back where it was when the engine shuts down (it may host other work, as in tests).
            self._host_affinity = allowed
            os.sched_setaffinity(0, cores)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # The engine core runs in a child process that inherits stderr: send it to a file so that when
        # it dies during start-up, vLLM's own reason (not "see root cause above") reaches the trial.
        self._log_path = Path(tempfile.mkstemp(prefix="vllm-tuner-engine-", suffix=".log")[1])
        saved_stderr = os.dup(2)
        try:
            with open(self._log_path, "w") as log:
                os.dup2(log.fileno(), 2)
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._spec.args))
        except Exception as error:  # vLLM raises many types; the reason is what matters
            reason = _reason_from_log(self._log_path) or root_cause(error)
            self._release_cores()
            raise EngineError(f"vLLM engine failed to start: {reason}") from None
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
        if cores:  # this process (the engine's frontend) and its client work on the other cores
            set_process_affinity(os.getpid(), other_cores(cores, allowed, claimed_cores(allowed)))
        self.info.update(pid=os.getpid(), start_s=round(time.perf_counter() - started, 2), node=_ray_node_id())
        return self.info

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        # ignore_eos alone gives exactly max_tokens tokens; min_tokens would add a logits processor to
        # every decode step that no real client asks for (it cost the small-batch config ~30% of its
        # capacity in benchmarks/capacity.py).
        params = SamplingParams(
            max_tokens=request.output_tokens,
            ignore_eos=True,
            temperature=0.0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        produced, gaps, last, queue_s = 0, [], None, None
        try:
            async for out in self._engine.generate(prompt, params, request_id=request.request_id):
                now = time.perf_counter()
                new = len(out.outputs[0].token_ids) if out.outputs else 0
                if new:
                    if last is None:
                        yield FirstToken(request.request_id)
                    else:
                        gaps.append(now - last)
                    # Tokens that arrive in one chunk arrived together: their gaps are 0.
                    gaps.extend([0.0] * (new - 1))
                    last, produced = now, produced + new
                if out.finished:
                    stats = out.metrics
                    if stats is not None and getattr(stats, "scheduled_ts", None) and stats.queued_ts:
                        queue_s = max(0.0, stats.scheduled_ts - stats.queued_ts)
        except Exception as error:
            if self._engine is not None and self._engine.errored:
                # The engine is dead, not just this request: fail the replica, so the pool stops routing
                # to it and retries its requests elsewhere.
                raise EngineDied(f"vLLM engine died: {self._death_reason()}") from None
            yield Finished(request.request_id, produced, tuple(gaps), queue_s, error=root_cause(error))
            return
        yield Finished(request.request_id, produced, tuple(gaps), queue_s)

    async def ping(self) -> float:
        """Answers while the engine lives; raises EngineError with vLLM's reason once it has died."""
        if self._engine is not None and self._engine.errored:
            raise EngineDied(f"vLLM engine died: {self._death_reason()}")
        return time.monotonic()

    def _death_reason(self) -> str:
        """Why the engine died: the last error its processes wrote (their stderr is the engine log), else
        how its engine-core process ended, else vLLM's generic EngineDeadError."""
        reason = _reason_from_log(self._log_path) if self._log_path is not None else None
        if reason and "EngineDeadError" not in reason:
            return reason
        try:  # vLLM internals: the engine-core processes of the multiprocessing client
            processes = self._engine.engine_core.resources.engine_manager.processes
            codes = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
        except AttributeError:
            codes = []
        if codes:
            code = codes[0]
            how = (
                f"killed by signal {-code}" + (" (SIGKILL: out of memory?)" if code == -9 else "")
                if code < 0
                else f"exit status {code}"
            )
            return f"the engine-core process ended ({how})"
        return root_cause(self._engine.dead_error)

    async def freeze(self) -> None:
        """Fault injection: stop this whole process (SIGSTOP). Only ever called inside its own actor."""
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)

    async def abort(self, request_ids: list[str]) -> None:
        if self._engine is not None and request_ids:
            await self._engine.abort(request_ids)

    async def reset_prefix_cache(self) -> None:
        if self._engine is not None:
            await self._engine.reset_prefix_cache()

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
        self._release_cores()

    def _release_cores(self) -> None:
        if self._host_affinity is not None:
            set_process_affinity(os.getpid(), self._host_affinity)
            self._host_affinity = None
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
        for handle in self._core_locks:
            handle.close()
        self._core_locks = []


class VllmServer:
    """One replica as it is deployed: `python -m vllm.entrypoints.openai.api_server` in a child process.

    The server listens on 127.0.0.1 only, with the dev endpoints on (for `/reset_prefix_cache`); its
    engine's threads are bound to the claimed cores. It runs in its own process group, so a freeze stops
    the API server and its engine together and a shutdown leaves nothing. Requests do not pass through
    this object: clients stream them from `info["url"]` (see `trainables.http_replica`).
    """

    def __init__(self, spec: EngineSpec) -> None:
        self._spec = spec
        self._process: subprocess.Popen | None = None
        self._core_locks: list[Any] = []
        self._log_path: Path | None = None
        self.url = ""
        self.info: dict[str, Any] = {}

    async def start(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Start the server and wait until it answers `/health`; returns facts about it (url, pid,
        bound cores, start seconds). Raises EngineError with vLLM's own reason when it cannot start."""
        started = time.perf_counter()
        env = {**os.environ, **self._spec.env, "VLLM_SERVER_DEV_MODE": "1", "TOKENIZERS_PARALLELISM": "false"}
        cores: list[int] = []
        if self._spec.on_cpu:
            cores, self._core_locks = claim_cores(self._spec.cpu_cores)
            env.update(engine_cpu_env(cores))
            self.info["cores"] = cores
        port = free_port()
        argv = server_command(self._spec.args, port)
        self._log_path = Path(tempfile.mkstemp(prefix="vllm-tuner-server-", suffix=".log")[1])
        with open(self._log_path, "w") as log:  # the guard leads the group and outlives nothing of it
            self._process = start_pinned(
                [sys.executable, str(Path(__file__).with_name("server_guard.py")), *argv], cores, env=env, stdout=log
            )
        self.url = f"http://127.0.0.1:{port}"
        try:
            await self._wait_ready(timeout_s)
        except BaseException:
            await self.shutdown()
            raise
        server_pid = (_children(self._process.pid) or [self._process.pid])[0]
        if cores:  # the API server works on free cores, else beside its engine; the engine core stays put
            set_process_affinity(server_pid, other_cores(cores, claimed=claimed_cores()))
        self.info.update(
            url=self.url,
            pid=os.getpid(),
            server_pid=server_pid,
            group=self._process.pid,
            start_s=round(time.perf_counter() - started, 2),
            node=_ray_node_id(),
        )
        return self.info

    async def _wait_ready(self, timeout_s: float) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    reason = (
                        _reason_from_log(self._log_path) if self._log_path else None
                    ) or f"the server exited with status {self._process.returncode if self._process else '?'}"
                    raise EngineError(f"vLLM engine failed to start: {reason}")
                try:
                    async with session.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as reply:
                        if reply.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.5)
        raise EngineError(f"vLLM engine failed to start: the server did not answer /health within {timeout_s:.0f}s")

    async def ping(self) -> float:
        """Answers while the server answers `/health`; raises EngineError with the reason once it died."""
        import aiohttp

        self._raise_if_dead()
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(f"{self.url}/health") as reply:
                    if reply.status != 200:  # vLLM's server answers 503 once its engine is dead
                        self._raise_if_dead()
                        raise EngineDied(
                            f"vLLM engine died: {self._log_reason() or 'its engine core died'} "
                            f"(/health answered {reply.status})"
                        )
            except aiohttp.ClientConnectorError as error:
                # Our own server refusing connections on loopback is going away: say why, once it has.
                for _ in range(20):
                    self._raise_if_dead()
                    await asyncio.sleep(0.1)
                raise EngineDied(
                    f"vLLM engine died: {self._log_reason() or 'its server stopped listening'} ({error_line_of(error)})"
                ) from None
        return time.monotonic()

    def _log_reason(self) -> str | None:
        """The most specific error the server or its engine logged, if any."""
        reason = _reason_from_log(self._log_path) if self._log_path is not None else None
        if reason is None:
            return None
        # vLLM's "See stack trace (above) for the root cause." points at a log nobody will see here.
        return re.sub(r"\.?\s*See stack trace.*$", "", reason).rstrip(". ") or None

    def _raise_if_dead(self) -> None:
        process = self._process
        if process is not None and process.poll() is not None:
            code = process.returncode
            how = (
                f"killed by signal {-code}" + (" (SIGKILL: out of memory?)" if code == -9 else "")
                if code < 0
                else f"exit status {code}"
            )
            raise EngineDied(f"vLLM engine died: {self._log_reason() or f'the server process ended ({how})'}")

    async def reset_prefix_cache(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for _ in range(20):  # refused while blocks are still held by requests finishing: retry
                async with session.post(f"{self.url}/reset_prefix_cache") as reply:
                    if reply.status == 200 and (await reply.json()).get("success", True):
                        return
                await asyncio.sleep(0.1)

    async def freeze(self) -> None:
        """Fault injection: stop the server and its engine (SIGSTOP to its process group)."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    async def kill_server(self) -> None:
        """Fault injection and declared deaths: the server and its engine die at once (SIGKILL)."""
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def kill(self) -> None:
        """As its own host (in tests): killing the host is killing the server."""
        await self.kill_server()

    async def abort(self, request_ids: list[str]) -> None:
        """Nothing to do: a client that stops reading a stream aborts its request on the server."""

    async def shutdown(self) -> None:
        """Stop the server and every process of its group (its engine too), SIGKILL after 30 s."""
        process, self._process = self._process, None
        if process is not None:
            group = process.pid
            try:
                os.killpg(group, signal.SIGCONT)  # a frozen server must run to exit cleanly
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 30
            while _group_alive(group, process) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(10)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
        for handle in self._core_locks:
            handle.close()
        self._core_locks = []


# Set by the server itself (or meaningless for it): never passed as server options.
_SERVER_OWN_ARGS = {"skip_tokenizer_init", "distributed_executor_backend"}


def server_command(engine_args: dict[str, Any], port: int) -> list[str]:
    """The command that serves `engine_args` on 127.0.0.1:`port` as the trial's `VllmServer`: the same
    options `vllm-serve.yaml` carries (`tuner.vllm_args`), with the server's own tokenizer (it
    detokenizes, as in production) and its own executor choice."""
    args = {k: v for k, v in engine_args.items() if k not in _SERVER_OWN_ARGS}
    if not args.get("disable_log_stats"):  # logging stats is the server's default; it has no --no- flag
        args.pop("disable_log_stats", None)
    model = args.pop("model")
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *serve_argv(args),
    ]


def error_line_of(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(c) for c in children.read().split()]
    except OSError:
        return []


def _group_alive(group: int, leader: subprocess.Popen) -> bool:
    """Whether any process of process group `group` still runs (the leader is reaped on the way)."""
    leader.poll()
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ray_node_id() -> str | None:
    """The Ray node this replica runs on, when it runs inside a Ray actor."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def root_cause(error: BaseException) -> str:
    """The innermost error's one-line message: what vLLM actually complained about."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    details = getattr(error, "errors", None)
    if callable(details):  # pydantic: name the field and the rule it broke
        try:
            first = details()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"{type(error).__name__}: {where}: {first.get('msg')} (got {first.get('input')!r})"
        except Exception:
            pass
    lines = [
        line.strip()
        for line in str(error).strip().splitlines()
        if line.strip() and not line.strip().startswith("For further information")
    ]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}".strip()


_VALIDATION_HEADER = re.compile(r"\d+ validation errors? for \w+$")
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")


def _strip_log_prefix(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip()).strip()


_ERROR_LINE = re.compile(r"^(?:.*\] )?(?:\(\w+ pid=\d+\) )?((?:\w+\.)*\w*(?:Error|Exception): .+)$")


def _reason_from_log(path: Path) -> str | None:
    """The last `SomethingError: message` line the engine's processes wrote, if any. A pydantic
    validation error's header is followed by its first field and message, on the same line."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    reasons = []
    for index, line in enumerate(lines):
        match = _ERROR_LINE.match(line.strip())
        if not match:
            continue
        reason = match.group(1)
        if _VALIDATION_HEADER.search(reason):
            detail = [_strip_log_prefix(x) for x in lines[index + 1 : index + 3] if x.strip()]
            reason = f"{reason}: {'; '.join(d for d in detail if d)}" if detail else reason
        reasons.append(reason)
    generic = (
        "Engine core initialization failed",
        "RuntimeError: Engine core",
        "See stack trace",
        "see root cause",
        "initialization failed due to an exception",
    )
    specific = [r for r in reasons if not any(g in r for g in generic)]
    return (specific or reasons or [None])[-1]


def engine_arg_names() -> set[str]:
    """Every argument vLLM's engine accepts (the names a search space may pass through)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def vllm_defaults(engine_args: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """What vLLM itself would choose for `names` given `engine_args` (model included) on this host.

    This is the baseline a search compares against. Raises EngineError when vLLM rejects the args
    (for example a model path it cannot read).
    """
    import logging

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    # vLLM narrates its config resolution (INFO and platform WARNINGs): nothing a user of the search can act
    # on, and the search's own progress lines would drown in it. Its errors still come through.
    logging.disable(logging.WARNING)  # vLLM's loggers carry their own levels: only a global switch reaches them
    try:
        config = AsyncEngineArgs(**engine_args).create_engine_config(UsageContext.ENGINE_CONTEXT)
    except Exception as error:
        raise EngineError(f"vLLM rejected the engine arguments: {root_cause(error)}") from None
    finally:
        logging.disable(logging.NOTSET)
    sources = (config.scheduler_config, config.cache_config, config.parallel_config, config.model_config)
    out: dict[str, Any] = {}
    for name in names:
        for source in sources:
            if hasattr(source, name):
                out[name] = getattr(source, name)
                break
    return out
