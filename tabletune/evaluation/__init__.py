"""``tabletune evaluate``'s parts without an engine: the arms it compares (``arms``) and the
statistics of what it measured (``results``); ``tabletune/evaluate.py`` runs the servers."""
