from stackbuild.cli.main import run

run()
