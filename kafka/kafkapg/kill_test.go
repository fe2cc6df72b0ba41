package kafkapg_test

const childEnv = "KAFKAPG_KILL_CHILD_BROKERS"

func runChild() int { return 0 }
