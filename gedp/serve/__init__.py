"""``gedp serve``: a page for data users and a JSON API answering tabulations of releases held in
memory, with the numbers ``gedp tabulate`` gives (``gedp.serve.releases``, ``gedp.serve.app``)."""
