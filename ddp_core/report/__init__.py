"""The book's pages, one module per page, named after it (`nodes` for book/studies/nodes.md, `gpu` for book/gpu.md).
They sit above the analysis layer (`ddp_core.analysis`), which is all they import besides `page`'s glue.

Every page module has one shape. `*_table` returns a DataFrame, `*_markdown` a Markdown string, `*_figure` a Figure.
`findings` returns the page's `Findings`, a frozen record whose field names are the names the page quotes.
Prose lives in the pages; a module words only what the outcome decides.
"""
