"""The studies and benchmarks of sedd: scripts that use the library, not part of it.

Run them from the repository root, as files or as modules:

    python experiments/block_study.py ...            python -m experiments.block_study ...
    python experiments/benchmarks/bench.py memory    python -m experiments.benchmarks.bench memory

What they share is a module of this package each:

  timing    the machine a figure was measured on, interleaved timing, paired
            ratios, tokens a network call, plain-text tables;
  quality   the Markov corpus of the studies and its exact scoring (a text's
            NLL under the chain), the quality of a batch of samples;
  writing   how a study asks a run to write (its samplers and steps by what
            its kind does, not by its name).

A script run as a file is not inside this package, so each entry point
that uses these modules imports the package by its location first (five
lines at its top, the same in each: nothing of the package can be imported
before them): the package is registered in ``sys.modules`` and its modules
are then imported by their full names. ``sys.path`` is never changed, so the scripts
run from any working directory and a module of another project named like one
of ours is never picked up. Nothing in ``sedd/`` imports this package.
"""
