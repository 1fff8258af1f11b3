"""The helpers the tests share: tiny models, quickly trained assets, fakes, records, servers and checks.

Test files import from here (`from helpers.tiny import vit_config`), never from another test file.
"""
