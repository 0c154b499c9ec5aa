"""`python -m server [--model DIR] [--host H] [--port P] [--api-key KEY] ...`

With no --model it serves the built-in default model kept in the repository."""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import signal
import sys

import uvicorn

from .app import ServerConfig, create_app

# The model's load failure is an error line of its own; uvicorn's loggers keep their format.
logging.basicConfig(format="%(levelname)s:     %(message)s", level=logging.INFO)

DEFAULT_MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "default"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m server", description="TrellisForge OpenAI-compatible server")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--model-name", help="name clients use in 'model' (default: the directory's name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("TRELLISFORGE_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1 (or set TRELLISFORGE_API_KEY)")
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--max-seqs", type=int, default=16, help="sequences generating at once")
    parser.add_argument("--ctx", type=int, default=0,
                        help="the longest sequence, prompt and output, in tokens (0: the model's, capped at what the KV pool holds)")
    parser.add_argument("--kv-tokens", type=int, default=0,
                        help="positions the KV cache holds, shared by every sequence: one may take it all, and when it runs"
                             " out the youngest sequence waits and computes its tokens again (0: --max-seqs times --ctx, or"
                             " with --ctx 0 times the model's context capped at 8192)")
    parser.add_argument("--rows-max", type=int, default=None,
                        help="tokens per engine step: a long prompt's chunk (default 1024 on cuda, where the prompt"
                             " kernels gain from large chunks, 256 on cpu)")
    parser.add_argument("--tp-world", type=int, default=1, help="tensor-parallel ranks (processes)")
    parser.add_argument("--tp-rank", type=int, default=0, help="this process's rank: 0 serves HTTP, others are workers")
    parser.add_argument("--tp-master", help="HOST:PORT where rank 0 waits for the workers")
    parser.add_argument("--max-body-mb", type=float, default=8.0,
                        help="largest request body accepted, in MB; larger ones get 413 (default 8: ~2M tokens of text)")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="compute every prompt in full (by default a prompt's full KV pages that an earlier prompt"
                             " already computed are reused: the same numbers, less time to the first token)")
    parser.add_argument("--kv-dtype", choices=["f16", "f32", "fp8"], default="f16",
                        help="what the KV cache stores: f16 (default), f32 (the exact reference's numbers, twice the"
                             " memory) or fp8 (e4m3, GPUs of sm_89 and later; a quarter of f32's memory, less exact)")
    parser.add_argument("--responses-store-mb", type=float, default=256.0,
                        help="memory for the Responses API's stored responses (previous_response_id, GET /v1/responses/ID),"
                             " least recently used dropped first; 0 keeps none (default 256)")
    parser.add_argument("--keep-serving", action="store_true",
                        help="when the model fails to load, keep serving /health (503 with the cause) instead of exiting 1")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model_dir = pathlib.Path(args.model)
    if not (model_dir / "config.json").is_file():
        print(f"error: {model_dir} is not a checkpoint directory (no config.json)", file=sys.stderr)
        return 2
    if args.tp_world > 1 and not args.tp_master:
        print("error: --tp-world > 1 needs --tp-master HOST:PORT", file=sys.stderr)
        return 2
    if args.rows_max is None:
        args.rows_max = 1024 if args.backend == "cuda" else 256
    if args.tp_rank > 0:
        return run_worker(model_dir, args)
    if args.kv_tokens < 0 or args.ctx < 0:
        print("error: --kv-tokens and --ctx must not be negative", file=sys.stderr)
        return 2
    if args.max_body_mb <= 0:
        print("error: --max-body-mb must be positive", file=sys.stderr)
        return 2
    if args.responses_store_mb < 0:
        print("error: --responses-store-mb must not be negative", file=sys.stderr)
        return 2
    config = ServerConfig(model_dir=str(model_dir), model_name=args.model_name or model_dir.name, api_key=args.api_key,
                          backend=args.backend, max_seqs=args.max_seqs, ctx=args.ctx, kv_tokens=args.kv_tokens,
                          rows_max=args.rows_max,
                          tp_world=args.tp_world, tp_master=args.tp_master if args.tp_world > 1 else None,
                          max_body_mb=args.max_body_mb, prefix_cache=not args.no_prefix_cache, kv_dtype=args.kv_dtype,
                          responses_store_mb=args.responses_store_mb)
    print(f"trellisforge: serving {config.model_name} from {model_dir} ({args.backend}) on http://{args.host}:{args.port}/v1"
          + (" (API key required)" if args.api_key else ""), flush=True)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=30))
    state = app.state.trellisforge
    if not args.keep_serving:
        def stop(_: str) -> None:
            print("trellisforge: stopping: the model did not load (--keep-serving keeps /health up instead)",
                  file=sys.stderr, flush=True)
            server.should_exit = True
        state.on_load_failure = stop
    # uvicorn shuts down gracefully on Ctrl-C, then re-raises the signal to the handler it found:
    # a quiet one makes that a clean exit instead of a KeyboardInterrupt traceback.
    for caught in (signal.SIGINT, signal.SIGTERM):
        signal.signal(caught, lambda *_: None)
    server.run()
    if state.load_error and not args.keep_serving:
        print(f"trellisforge: stopped: {state.load_error}", file=sys.stderr, flush=True)
        return 1
    print("trellisforge: stopped", flush=True)
    return 0


def run_worker(model_dir: pathlib.Path, args: argparse.Namespace) -> int:
    """A tensor-parallel worker: no HTTP; serves rank 0's forwards until it shuts down."""
    import trellisforge
    print(f"trellisforge: rank {args.tp_rank} of {args.tp_world} joining {args.tp_master} with {model_dir}", flush=True)
    try:
        trellisforge.run_tp_worker(model_dir, args.tp_rank, args.tp_master)
    except (trellisforge.TrellisError, ValueError) as error:
        print(f"error: rank {args.tp_rank}: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"trellisforge: rank {args.tp_rank} stopped (the master shut down)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
