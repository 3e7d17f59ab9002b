"""The loading machinery: the engine and its plans, schedules and epochs, the process
transport, the loader's options and state, and what ``fastload.torch`` runs on. It sits
above the views and streams it loads. Nothing here is imported by users."""
