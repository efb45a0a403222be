"""Short programs that show the client library at work (run them with `python -m clients.examples.NAME`)."""
