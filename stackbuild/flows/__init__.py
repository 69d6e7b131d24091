"""The flows: the drivers that run the pipeline end to end (build and push, deploy to one
host, roll out a fleet, the demo). They open connections, build images and record;
host/, fleet/, image/ and results/ do each step; cli/ only parses and calls them."""
