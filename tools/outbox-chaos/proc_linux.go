package main

import "syscall"

// childAttr makes a publisher process die with the chaos process (on Linux), so that a
// chaos run killed hard leaves no publisher behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
