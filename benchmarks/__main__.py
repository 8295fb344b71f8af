"""``python -m benchmarks``: the side-by-side table of `benchmarks.run`."""

from benchmarks.run import main

main()
