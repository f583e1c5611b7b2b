"""Tabulations as users ask for them: the one request path of the command line, the API and the
server; panel tables and gross job gains and losses; the files a table is written to."""
