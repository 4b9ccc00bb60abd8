"""Loop rules, one module each: given a session's recent calls, is this a loop?"""
