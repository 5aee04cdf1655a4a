"""The detq ledger: models, engine, migrations and repository functions; imports neither worker nor producer."""  # noqa: E501
