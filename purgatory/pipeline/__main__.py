"""``python -m purgatory.pipeline``; also the script ``spark-submit`` runs (absolute imports)."""

from purgatory.pipeline._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
