"""The netmon dashboard, one module per row; grafana/build_dashboard.py writes it out.

builders holds the panel and query builders every row uses; document puts the rows in order
under the dashboard's variables and annotations.
"""
