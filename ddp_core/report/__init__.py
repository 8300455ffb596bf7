"""The report's analysis: reading runs, the scaling table, the cost model, and each chapter's findings and figures.

Every chapter module has one shape: it reads what `results` loads (an `Experiment`, a study's `Experiment`s
or a single-device `Measurement`; a folder it cannot read raises `ResultsError`) and offers the same verbs
with the same return types: `*_table` a DataFrame, `*_markdown` a Markdown string, `*_figure` a Figure, and
`findings` (or `<topic>_findings` where a module serves several pages) a dict that the page glues under its
names. Prose lives in the pages; a module words only what the outcome decides (`*_sentence`, `*_phrase`)
or what many pages say alike (`provenance.study_setup_findings`).
"""
