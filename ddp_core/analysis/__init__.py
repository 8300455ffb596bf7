"""The report's analysis layer: loading runs and measurements (`results`), comparing them (`comparisons`, the one
verdict in `verdict`), the tables every chapter builds on (`speedups`, `throughput`), the cost model and the
predictors (`cost_model`, `replay`, `nvlink_forecast`, `similarity`), and where a result came from (`provenance`).

It imports nothing of the pages (`ddp_core.report`), and the benchmarks and the study runner import it, not them.
Functions return numbers, DataFrames, figures and short outcome words; a loaded folder it cannot read raises
`results.ResultsError`.
"""
