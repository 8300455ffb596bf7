"""The report's studies: the declarative list (notebooks/studies.yml) and the runner that trains it."""
