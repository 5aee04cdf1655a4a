"""The demo and evaluation kit: synthetic shape scenes, detection metrics, and `detq demo` end to end."""
