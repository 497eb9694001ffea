"""The HTTP server (FastAPI + uvicorn) and its start-up."""
