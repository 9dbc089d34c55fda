"""What the user sees: events and outcomes as text or JSON lines (render.py) and the JSON Schema of those
lines (json_schema.py), errors (errors_view.py), the status table and its sparklines (status_view.py,
spark.py), and the terminal's looks (style.py)."""
