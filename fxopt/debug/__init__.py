"""Debugging aids: what each pass did to each graph.

- :mod:`~fxopt.debug.dump`: the ``debug_dir`` instrument (readable dumps per stage and
  pass, their plain-data twins with predicted memory, plans, repros, ``index.json``);
- :mod:`~fxopt.debug.snapshot`: a graph as plain data; :mod:`~fxopt.debug.repro`: a
  runnable repro of a captured graph;
- :mod:`~fxopt.debug.diff`: nodes added, removed, replaced and changed per pass (or
  between two dumps); :mod:`~fxopt.debug.text` and :mod:`~fxopt.debug.html` render it
  (``fxopt diff`` is :mod:`fxopt.cli.debug`).
"""
