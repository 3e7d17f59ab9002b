"""The loading machinery: the engine and its plans, schedules and epochs, the process
transport, the walkers of nested observations, keyword checks, and what
``fastload.torch`` runs on. Nothing here is imported by users."""
