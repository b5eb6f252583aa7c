"""The frontend's end of its engines: the rings' client, replicas behind one client, request limits, metrics."""
