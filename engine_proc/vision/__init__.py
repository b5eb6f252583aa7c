"""Images, loaded only when the engine has a projector (--mmproj): the projector itself (projector), the thread
that checks and encodes a request's images (encoder), and what turns a request with images into one the
scheduler queues (image_intake). Nothing below the engine imports this package."""
