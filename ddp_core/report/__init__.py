"""The book's pages, one module per page, named after it (`nodes` for book/studies/nodes.md, `gpu` for book/gpu.md),
above the analysis layer (`ddp_core.analysis`), which is all they import besides `page`'s glue.

Every page module has one shape: it reads what `ddp_core.analysis.results` loads (an `Experiment`, a study's
`Experiment`s or a single-device `Measurement`) and offers the same verbs with the same return types: `*_table` a
DataFrame, `*_markdown` a Markdown string, `*_figure` a Figure, and `findings` (or `<topic>_findings`) a dict that
the page glues under its names. Prose lives in the pages; a module words only what the outcome decides.
"""
