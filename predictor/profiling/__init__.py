"""``tandem profile``: isolated and co-located profiling runs that build ``training_data/``.

Modules: :mod:`.backend` (protocol and values), :mod:`.cuda` with :mod:`.nvml`,
:mod:`.pool` and :mod:`.worker` (the real GPU path), :mod:`.sim` (synthetic, for
tests), :mod:`.spec` and :mod:`.plan` (what to run), :mod:`.campaign` (running it
within a budget), :mod:`.store` (append-only CSVs and repair), :mod:`.runner`
(wiring and provenance), :mod:`.commands` (the CLI). The schema of the files is
:mod:`predictor.dataset_schema`'s.
"""
