"""What `/metrics` shows: the snapshot of results (snapshot), every exported family as data
(catalogue), the collectors that build families from a snapshot (collector), the hardened HTTP
server (http) with its web-config (webschema, webconfig), and `netmon probe --textfile`."""
