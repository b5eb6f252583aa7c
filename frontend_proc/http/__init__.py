"""HTTP: the Starlette app, body decoding, Server-Sent Events, middleware, the OpenAPI document and a response's
lifecycle."""
