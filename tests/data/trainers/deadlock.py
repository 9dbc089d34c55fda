"""Two threads that take two locks in opposite order: a deadlock, and the log goes silent."""
import threading

first, second = threading.Lock(), threading.Lock()
both = threading.Barrier(2)


def take_first_then_second():
    with first:
        both.wait()
        with second:
            pass


def take_second_then_first():
    with second:
        both.wait()
        with first:
            pass


workers = [threading.Thread(target=take_first_then_second), threading.Thread(target=take_second_then_first)]
for w in workers:
    w.start()
print("step 1: two workers started", flush=True)
for w in workers:
    w.join()
