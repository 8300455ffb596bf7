"""The report's analysis layer: it loads the runs, compares them, and builds what the chapters show.

Loading is `results`, and comparing is `comparisons`, with the one verdict in `verdict`. The tables every chapter
builds on are `speedups` and `throughput`. The cost model and the predictors are `cost_model`, `replay`,
`nvlink_forecast` and `similarity`. Where a result came from is `provenance`.

It imports nothing of the pages (`ddp_core.report`), so the benchmarks and the study runner can import it. Functions
return numbers, DataFrames, figures and short outcome words. A folder it cannot read raises `results.ResultsError`.
"""
