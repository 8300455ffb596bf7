"""The report's analysis: reading runs, the scaling table, the cost model, and each chapter's findings and figures."""
