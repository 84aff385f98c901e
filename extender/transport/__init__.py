"""HTTP transport: the extender/v1 wire types, the Flask routes and the cheroot server."""
