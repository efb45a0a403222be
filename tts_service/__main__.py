"""`python -m tts_service` runs the server, as `qwen3-tts-server` does."""

from tts_service.api.main import main

if __name__ == "__main__":
    raise SystemExit(main())
