"""Results to the nodes' daemons and to Prometheus: each node's report, sealed and POSTed to
its daemon (which takes it through the inbox), and the sweep host's textfile."""
