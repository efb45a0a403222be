"""`python -m tts_service` / `qwen3-tts-server`: configuration -> model -> engine -> gRPC server.

The server listens before the model has loaded, so health checks answer NOT_SERVING (and speech
calls UNAVAILABLE) during a load that can take minutes; it turns SERVING once the engine runs and
one short warm-up synthesis has gone through it.
SIGTERM or SIGINT drains it: NOT_SERVING, new calls refused, running calls given the drain
timeout to finish, then the engine stops. A port already in use ends it at once, with exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, TypeVar

from observability.gc_pauses import freeze_startup_objects, thaw_startup_objects, watch_pauses
from observability.logs import configure_logging
from tts_service.api.config import ConfigError, ServerConfig, load_config

if TYPE_CHECKING:
    from observability.metrics import ServiceMetrics
    from observability.tracing import CallTracer
    from tts_service.engine import Engine, EngineCores, EngineProcess, ModelInfo

T = TypeVar("T")

logger = logging.getLogger("tts_service")


def package_version() -> str:
    try:
        return version("qwen3-tts-service")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+source"


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_devices(device: str) -> list[str]:
    """The devices `--device` names, one engine core each: `all` is every GPU this process sees."""
    if device == "all":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device all: this machine has no CUDA GPU")
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return [resolve_device(name.strip()) for name in device.split(",")]


def load_engine(config: ServerConfig) -> Engine:
    """Exactly the configured model in an engine, not started (on `cuda:N`, with only that GPU visible to this
    process, as an engine core has it: see `only_device_visible`)."""
    from tts_service.engine import Engine
    from tts_service.engine.core_process import only_device_visible

    return Engine.load(config.model, only_device_visible(resolve_device(config.device)), config.engine)


async def start_engine(config: ServerConfig) -> Engine | EngineProcess | EngineCores:
    """The configured model in a running engine: in a process of its own (one per device when there are several),
    or (with --no-engine-process) loaded in a daemon thread of this one, so that health checks are answered while
    it loads either way."""
    if not config.engine_process:
        engine = await in_daemon_thread(lambda: load_engine(config))
        # Nothing outside this process watches the engine here: it bounds its own steps.
        engine.start(stall_timeout_s=config.engine_stall_timeout_seconds)
        return engine
    from tts_service.engine import CoreSpec, EngineCores, EngineProcess
    from tts_service.engine.cores import core_specs

    devices = resolve_devices(config.device)
    spec = CoreSpec(config.model, devices[0], config.engine, config.log_level, config.log_format,
                    config.gil_switch_interval_ms / 1000, config.engine_stall_timeout_seconds)
    if len(devices) == 1:
        return await EngineProcess.start(spec)
    return await EngineCores.start(core_specs(spec, devices))


def in_daemon_thread(function: Callable[[], T]) -> asyncio.Future[T]:
    """Run `function` in a daemon thread, so that a shutdown during a long model load need not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)  # type: ignore[arg-type]
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            result, error = function(), None
        except BaseException as caught:  # handed to the loop, which raises it where it is awaited
            result, error = None, caught
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for the model any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="tts-model-load", daemon=True).start()
    return future


def create_metrics(config: ServerConfig, model: ModelInfo) -> ServiceMetrics | None:
    """The metrics of `model`, which the server serves on the metrics port; None when no port is configured."""
    if config.metrics_port is None:
        return None
    from observability.metrics import ServiceMetrics, mode_label

    mode = mode_label(model.model_type)
    metrics = ServiceMetrics(model.source, mode)
    metrics.build_info.info({"version": package_version(), "model": model.source, "mode": mode,
                             "dtype": model.dtype, "device": model.device,
                             "random_weights": str(model.is_random).lower(),
                             "kernels": ",".join(model.kernel_paths) or "none"})
    return metrics


def start_tracing(config: ServerConfig, model: ModelInfo) -> CallTracer | None:
    """Spans of speech calls exported over OTLP, as the OTEL_* variables configure; None when tracing is off."""
    if not config.is_tracing_enabled:
        return None
    from observability.metrics import mode_label
    from observability.tracing import CallTracer, otlp_provider

    logger.info("tracing: spans exported over OTLP/gRPC")
    return CallTracer(otlp_provider(package_version()), model.source, mode_label(model.model_type))


async def serve(config: ServerConfig) -> int:
    from tts_service.api.lexicon_store import LexiconStoreUnusableError
    from tts_service.api.server import TtsServer
    from tts_service.engine import CheckpointError, EngineCoreExited, RequestFailed, VoiceStoreUnusableError

    try:
        server = TtsServer(config)
        await server.start()
    except OSError as error:  # a port in use: serving beside its owner would take a share of its connections
        logger.error("%s", error)
        return 1
    except LexiconStoreUnusableError as error:
        logger.error("cannot use the voice store: --voice-store %s (for lexicons): %s", config.engine.voice_store_dir,
                     error)
        return 1
    tracer: CallTracer | None = None
    gc_watch = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        loading = asyncio.ensure_future(start_engine(config))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            logger.info("stopping before the model finished loading")
            loading.cancel()
            return 0
        engine = loading.result()
        try:
            await engine.warm_up()
        except RequestFailed as error:  # the engine cannot synthesize: serving would fail every call
            logger.error("the warm-up synthesis failed: %s", error)
            await engine.stop()
            return 1
        logger.info("froze %d start-up objects out of the garbage collector's walks", freeze_startup_objects())
        gc_watch = watch_pauses("server")
        tracer = start_tracing(config, engine.model_info)
        await server.serve(engine, create_metrics(config, engine.model_info), tracer)
        exited = asyncio.ensure_future(engine.wait_exited())
        await asyncio.wait([stopping, exited], return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():  # the engine ended on its own: a supervisor restarts the server
            logger.error("the engine stopped unexpectedly: the server stops serving")
            await server.stop_serving()
            return 1
        logger.info("shutdown requested")
        return 0
    except EngineCoreExited as error:
        logger.error("%s", error)
        return 1
    except VoiceStoreUnusableError as error:
        logger.error("cannot use the voice store: %s", error)
        return 1
    except (CheckpointError, ValueError, OSError) as error:
        logger.error("cannot load the model: %s", error)
        return 1
    finally:
        await server.shutdown()
        if tracer is not None:
            tracer.shutdown()
        if gc_watch is not None:
            gc.callbacks.remove(gc_watch)
            thaw_startup_objects()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load_config(argv)
    except ConfigError as error:
        sys.stderr.write(f"qwen3-tts-server: {error}\n")
        return 2
    configure_logging(config.log_level, config.log_format)
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000)
    logger.info("configuration:\n%s", config.describe())
    status = asyncio.run(serve(config))
    if status != 0 and not config.engine_process:  # only an in-process engine has a runner thread here
        exit_past_a_stuck_runner(status)
    return status


def exit_past_a_stuck_runner(status: int) -> None:
    """End the process now if an in-process engine's runner thread is stuck in a call (a stalled step): the
    interpreter's exit would wait for it for ever, and a supervisor restarts only a process that has ended."""
    from tts_service.engine.engine import RUNNER_THREAD_NAME

    stuck = [thread.name for thread in threading.enumerate()
             if thread.name.startswith(RUNNER_THREAD_NAME) and thread.is_alive()]
    if stuck:
        logger.error("exiting without waiting for %s, stuck in a step", ", ".join(stuck))
        logging.shutdown()
        os._exit(status)


if __name__ == "__main__":
    raise SystemExit(main())
