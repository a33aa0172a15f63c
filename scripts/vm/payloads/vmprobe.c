/* Payloads for scripts/vm/cgroup-v2-checks.sh, built static by run-in-vm.sh (the VM has
 * only busybox):
 *   vmprobe alloc MB    allocate MB MiB and touch every page, then exit 0
 *   vmprobe forks N     fork N children that sleep, exit 3 when a fork fails
 *   vmprobe spin        burn CPU forever
 *   vmprobe asuser UID GID CMD [ARG...]
 *                       exec CMD as UID:GID without supplementary groups (the guest has
 *                       no user database for busybox's su)
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "alloc") == 0) {
        long mb = atol(argv[2]);
        for (long i = 0; i < mb; i++) {
            char *p = malloc(1 << 20);
            if (!p) {
                fprintf(stderr, "vmprobe: malloc failed after %ld MiB\n", i);
                return 2;
            }
            memset(p, (int)(i & 0xff) | 1, 1 << 20);
        }
        printf("vmprobe: allocated and touched %ld MiB\n", mb);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "forks") == 0) {
        long n = atol(argv[2]);
        for (long i = 0; i < n; i++) {
            pid_t pid = fork();
            if (pid < 0) {
                fprintf(stderr, "vmprobe: fork %ld failed: %s\n", i, strerror(errno));
                kill(0, SIGKILL);
                return 3;
            }
            if (pid == 0) {
                sleep(30);
                _exit(0);
            }
        }
        printf("vmprobe: forked %ld children\n", n);
        kill(0, SIGKILL);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "spin") == 0) {
        volatile unsigned long x = 0;
        for (;;)
            x++;
    }
    if (argc >= 5 && strcmp(argv[1], "asuser") == 0) {
        uid_t uid = (uid_t)atol(argv[2]);
        gid_t gid = (gid_t)atol(argv[3]);
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
            fprintf(stderr, "vmprobe: cannot become %u:%u: %s\n", uid, gid, strerror(errno));
            return 125;
        }
        execvp(argv[4], &argv[4]);
        fprintf(stderr, "vmprobe: exec %s: %s\n", argv[4], strerror(errno));
        return 127;
    }
    fprintf(stderr, "usage: vmprobe alloc MB | forks N | spin | asuser UID GID CMD...\n");
    return 64;
}
