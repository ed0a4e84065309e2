package main

import (
	"os"
	"syscall"
)

// childAttr makes a publisher or consumer process die with the chaos process (on Linux), so
// that a chaos run killed hard leaves no process behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// pauseSignals are the signals that pause and resume a process (nil: none).
func pauseSignals() (pause, resume os.Signal) { return syscall.SIGSTOP, syscall.SIGCONT }
