/*
 * At-most-once protocol of ngx_http_idempotency_module (record format 2),
 * one key, checked by SPIN.  model/README.md maps each step to the C and
 * explains the fixes; model/run.sh lists the configurations.
 *
 * Sizes: NE edges, NR requests each, lease L, renew every RI, skew S,
 * horizon H (ticks), outcome TTL T, claim reply delay DELAY, MAXF Redis
 * faults, MAXUP upstream faults, MAXTRY sends of a finish or release.
 *
 * Policy: POLICY=0|1|2 (keep | forward | release).
 * Faults:
 *   LOSS             a Redis reply is lost, the command applied or not
 *   STALL            a claim or renew stalls in Redis and lands later
 *   REORDER          a lost claim's release may overtake the stalled claim
 *   DIE              an edge's request dies at any step (one death)
 *   SLOW             an owner misses its renewals: its lease lapses alive
 *   UPFAULT          upstream: never reached, 503, no header after or
 *                    before it executed
 *   FAILOVER [WAIT]  Redis fails over once, losing what is not replicated
 *   TTLEXP           Redis expires keys (a lease after L+T, outcomes T)
 * Proposed fixes of the protocol (README, "Holes found"):
 *   FIX_JUDGE FIX_SEND FIX_RENEW_MAX FIX_RENEW_TTL FIX_TAKER_UNK
 *   EXCUSE_RELEASE_LOST (a wider exception in the outcome-unknown claim)
 * Mutants that must fail: MUT_FINISH_NOOWNER MUT_EXPIRED_FREE
 *   MUT_ORPHAN_DEL MUT_TAKE_HEAD MUT_NO_MARGIN
 * LIVE: the liveness claim only (spin -a, pan -a -f).
 */

#define KEEP    0
#define FORWARD 1
#define RELEASE 2

#ifndef POLICY
#define POLICY KEEP
#endif
#ifndef NE
#define NE 2            /* edges (nginx hosts), 2 or 3 */
#endif
#ifndef NR
#define NR 2            /* requests per edge: a first try and a retry */
#endif
#define NO (NE*NR)      /* request (= owner) ids 1..NO, 0 is nobody */
#ifndef L
#define L 4             /* lease length, in ticks */
#endif
#ifndef RI
#define RI 1            /* renew interval, <= L/3 */
#endif
#ifndef S
#define S 1             /* largest clock difference between edges, < L/3 */
#endif
#ifndef H
#define H 6             /* the horizon: the clock stops there */
#endif
#ifndef T
#define T 1             /* outcome TTL, only with TTLEXP */
#endif
#ifndef MAXF
#define MAXF 1          /* Redis faults (lost replies, stalls) per run */
#endif
#ifndef MAXUP
#define MAXUP 1         /* upstream faults per run */
#endif
#ifndef DELAY
#define DELAY 1         /* ticks a claim reply may take (redis_timeout) */
#endif
#ifndef MAXTRY
#define MAXTRY 2        /* sends of one finish before its deadline */
#endif

/* record states; a lease and an unknown are both CLAIM (state 1) in Redis */
#define NONE  0
#define LEASE 1
#define UNK   2
#define DONE  3

/* fate of one Redis command */
#define OK     0        /* applied, reply received */
#define LOSTA  1        /* applied, reply lost */
#define LOSTN  2        /* not applied, reply lost */
#define STALLED 3       /* waits in Redis, lands later or never */

/* what the upstream did for an owner */
#define NEVER 1         /* never sent: release */
#define STORE 2         /* a storable response */
#define RELST 3         /* 408/425/429/503: release */
#define NOHDR 4         /* sent, no header: may have run */

typedef Rec {
    byte st;            /* NONE LEASE UNK DONE */
    byte own;           /* owner of the claim, or of the token in a DONE */
    byte dl;            /* lease deadline, the owner's clock */
    byte resp;          /* DONE: id of the response (= the executed owner) */
    byte exp            /* TTLEXP: when Redis drops the key (global time) */
};

Rec m;                  /* the master: one linearizable store */
#ifdef FAILOVER
Rec rep;                /* the replica that a failover promotes */
bit failed;
#endif

typedef Pend {          /* a stalled command of an edge, still in Redis */
    byte op;            /* 0, PCLAIM, PRENEW */
    byte own;
    byte dl
};
#define PCLAIM 1
#define PRENEW 2
Pend pend[NE];

byte tick;               /* global time */
byte off[NE];           /* clock of edge e = tick + off[e], off in [0,S] */
#define CLK(e) (tick + off[e])
#define OEDGE(o) (((o) - 1) / NR)

bit  renewing[NE];      /* the edge's owner renews its lease */
byte lastsend[NE];      /* its clock when it last sent claim or renew */
bit  kill[NE];          /* set by the killer: the edge's request dies */
bit  inread[NE];        /* a claim reply is on its way to the edge */
byte rtick[NE];         /* when Redis read the record for it */

/* the upstream, and what the properties look at */
byte execs;             /* executions in the current window */
bit  seen;              /* the deduplicating upstream has seen the key */
byte first;             /* the owner whose execution came first */
bit  executed[NO + 1];
bit  nsent;             /* a request reached the upstream */
bit  excused;           /* a fault that may leave a never-run key unknown */
bit  relgaveup;         /* an owner's release acknowledged late or never */
bit  opend[NE];         /* a lost claim's release not acknowledged yet */
bit  fpend[NE];         /* an owner's release not acknowledged yet */
byte nfault, nup;
#ifdef LIVE
byte ndone;             /* requests ended */
bit  nbad;              /* one ended other than new or replay */
#define BAD nbad = 1
#define DONE1 ndone++
#else
#define BAD skip        /* counted only for the liveness claim */
#define DONE1 skip
#endif

/*
 * Outcome-unknown for a key that never reached the upstream is allowed
 * after an owner died, a lease lapsed under a live owner, a failover, or a
 * lost claim whose release was not acknowledged before its deadline; with
 * EXCUSE_RELEASE_LOST also when an owner's own release was not.
 */
#if NE == 2
#define OPEND (opend[0] || opend[1])
#define FPEND (fpend[0] || fpend[1])
#else
#define OPEND (opend[0] || opend[1] || opend[2])
#define FPEND (fpend[0] || fpend[1] || fpend[2])
#endif
#ifdef EXCUSE_RELEASE_LOST
#define UNKEXCUSE (OPEND || relgaveup || FPEND)
#else
#define UNKEXCUSE OPEND
#endif

#define DUE(e) (renewing[e] && CLK(e) >= lastsend[e] + RI)
/* a claim reply at its timeout: it arrives before time moves on */
#define LATE(e) (inread[e] && tick >= rtick[e] + DELAY)
#if NE == 2
#define ANYDUE (DUE(0) || DUE(1))
#define ANYLATE (LATE(0) || LATE(1))
#else
#define ANYDUE (DUE(0) || DUE(1) || DUE(2))
#define ANYLATE (LATE(0) || LATE(1) || LATE(2))
#endif

/* the record at hand differs from the value v read before */
#define SAME(v) (m.st == v.st && m.own == v.own && m.dl == v.dl \
                 && m.resp == v.resp)
/* a key's expiry time; without TTLEXP always 0, to keep states few */
#ifdef TTLEXP
#define GONE (m.st != NONE && tick >= m.exp)
#define EXPAT(x) (x)
#else
#define GONE 0
#define EXPAT(x) 0
#endif

inline setrec(a_st, a_own, a_dl, a_resp, a_exp) {
    m.st = a_st; m.own = a_own; m.dl = a_dl; m.resp = a_resp; m.exp = a_exp
}

/*
 * Redis drops an expired key when it is touched.  Dropping a DONE or an
 * unknown, or a lease T after its deadline, ends the window in which
 * at-most-once is promised: the counts start again.  A lease dropped
 * sooner (its owner alive, its TTL not refreshed) does not end it.
 */
inline expire() {
#ifdef TTLEXP
    if
    :: GONE ->
        if
        :: m.st == LEASE && tick + off[OEDGE(m.own)] < m.dl + T -> skip
        :: else -> execs = 0; seen = 0; first = 0
        fi;
        setrec(NONE, 0, 0, 0, 0)
    :: else
    fi
#else
    skip
#endif
}

/* a write acknowledged under WAIT is on the replica */
inline replicate(how) {
#if defined(FAILOVER) && defined(WAIT)
    if
    :: how == OK -> rep.st = m.st; rep.own = m.own; rep.dl = m.dl;
                    rep.resp = m.resp; rep.exp = m.exp
    :: else -> skip     /* WAIT timed out or the reply was lost */
    fi
#else
    skip
#endif
}

/* the fate of a command; a lost reply is a timeout too */
inline fate(canstall) {
    if
    :: how = OK
#ifdef LOSS
    :: nfault < MAXF -> nfault++; how = LOSTA
    :: nfault < MAXF -> nfault++; how = LOSTN
#endif
#ifdef STALL
    :: canstall && pend[e].op == 0 && nfault < MAXF -> nfault++;
       how = STALLED
#endif
    fi
}

/* claim(K, c): SET K c NX GET PX L+T */
inline do_claim(o, d) {
    expire();
    if
    :: m.st == NONE -> setrec(LEASE, o, d, 0, EXPAT(tick + L + T)); rnil = 1
    :: m.st == LEASE && m.own == o && m.dl == d -> rnil = 1   /* a resend */
    :: else -> rnil = 0;
        v.st = m.st; v.own = m.own; v.dl = m.dl; v.resp = m.resp;
        /* a replay is the executed request's own response */
        assert(m.st != DONE || executed[m.resp]);
        assert(m.st != DONE || POLICY == RELEASE || m.resp == first)
    fi
}

/* renew(K, c, d): only the owner's lease ('L') moves its deadline */
inline do_renew(o, d) {
    expire();
    if
    :: m.st == LEASE && m.own == o ->
#ifdef FIX_RENEW_MAX
        if
        :: m.dl < d -> m.dl = d     /* a late renew never moves it back */
        :: else
        fi;
#else
        m.dl = d;
#endif
#ifdef FIX_RENEW_TTL
        m.exp = EXPAT(tick + L + T);   /* the key lives as long as its lease */
#endif
        ret = 1
    :: else -> ret = 0
    fi
}

/*
 * finish(K, c, v): the owner's claim (lease or unknown) takes v (vst NONE:
 * DEL); a resend finding its own v says 1; else 0.
 */
inline do_finish(o, vst, vresp) {
    expire();
    if
#ifdef MUT_FINISH_NOOWNER
    :: true ->
#else
    :: (m.st == LEASE || m.st == UNK) && m.own == o ->
#endif
        if
        :: vst == NONE -> setrec(NONE, 0, 0, 0, 0)
        :: else -> setrec(vst, o, 0, vresp, EXPAT(tick + T))
        fi;
        ret = 1
    :: else ->
        if
        :: vst != NONE && m.st == vst && m.own == o -> ret = 1
        :: else -> ret = 0
        fi
    fi
}

/* take(K, old, c): compare-and-set on the whole value read */
inline do_take(o, d) {
    expire();
    if
#ifdef MUT_TAKE_HEAD
    :: m.st == v.st && m.own == v.own ->         /* the deadline ignored */
#else
    :: SAME(v) ->
#endif
        setrec(LEASE, o, d, 0, EXPAT(tick + L + T)); ret = 1
    :: else -> ret = 0
    fi
}

/* a stalled command lands */
inline land(i) {
    expire();
    if
    :: pend[i].op == PCLAIM && m.st == NONE ->
        setrec(LEASE, pend[i].own, pend[i].dl, 0, EXPAT(tick + L + T))
    :: pend[i].op == PRENEW && m.st == LEASE && m.own == pend[i].own ->
#ifdef FIX_RENEW_MAX
        if
        :: m.dl < pend[i].dl -> m.dl = pend[i].dl
        :: else
        fi;
#else
        m.dl = pend[i].dl;
#endif
#ifdef FIX_RENEW_TTL
        m.exp = EXPAT(tick + L + T)
#endif
    :: else -> skip
    fi;
    pend[i].op = 0; pend[i].own = 0; pend[i].dl = 0
}

/*
 * The upstream, at the moment the request is sent (from then on it may have
 * run).  Under forward it deduplicates: a request carrying
 * Idempotency-Previous-Outcome for a key it has seen gets the first answer.
 * A request without that header is never deduplicated, so under forward the
 * module must never send one after the key already ran.
 */
inline send_upstream(o) {
    nsent = 1;
    if
    :: POLICY == FORWARD && flag && seen -> resp = first; outc = STORE
    :: else ->
        if
        :: execs++; executed[o] = 1; resp = o; outc = STORE
#ifdef UPFAULT
        :: nup < MAXUP -> nup++; execs++; executed[o] = 1; outc = NOHDR
        :: nup < MAXUP -> nup++; outc = NOHDR    /* reset before it ran */
        :: nup < MAXUP -> nup++; outc = RELST    /* 503: nothing ran */
#endif
        fi;
        if
        :: executed[o] && !seen -> seen = 1; first = o
        :: else
        fi;
        assert(execs <= 1)              /* at most once */
    fi
}

/* renew, every RI ticks while the owner's request lives */
inline renew(o) {
    lastsend[e] = CLK(e);
    mydl = CLK(e) + L;
    fate(1);
    if
    :: how == STALLED ->
        pend[e].op = PRENEW; pend[e].own = o; pend[e].dl = mydl;
        excused = 1     /* the lease may lapse while its owner lives */
    :: how == LOSTN -> skip
    :: else -> do_renew(o, mydl)
    fi;
    replicate(how);
    if
    :: how == OK && ret -> dack = mydl
    :: else
    fi;
    ret = 0
}

/*
 * The lease judgement of a claim reply (v read, mydl = sent + L).  As
 * written: live iff the reader's clock when the reply arrives <= d.  Fixed:
 * live iff its clock when it sent the claim <= d + S, so neither a late
 * reply nor a clock ahead by S makes a live owner's lease look expired.
 */
#ifdef FIX_JUDGE
#ifdef MUT_NO_MARGIN
#define MARGIN 0
#else
#define MARGIN S
#endif
#define LIVE_LEASE (mydl - L <= v.dl + MARGIN)
#else
#define MARGIN 0
#define LIVE_LEASE (CLK(e) <= v.dl)
#endif

/* claim(K, CLAIM(o, mydl)) with the fate of the command */
inline send_claim(o) {
    fate(1);
    if
    :: how == STALLED ->
        pend[e].op = PCLAIM; pend[e].own = o; pend[e].dl = mydl
    :: how == LOSTN -> skip
    :: else -> do_claim(o, mydl)
    fi;
    replicate(how);
    rtick[e] = tick;
    opend[e] = (how != OK)      /* its release is due */
}

/* the claim is ours: renew from its send on (mydl = send + L) */
inline own_it() {
    renewing[e] = 1; lastsend[e] = mydl - L; dack = mydl
}

proctype edge(byte e) {
    byte r, o, outc, resp, ret, tries, how;
    byte mydl, dack, vst;
    bit  rnil, flag;
    Rec  v;

    r = 0;
    do
    :: r < NR ->
        o = e * NR + r + 1;
        {
        skip;
claim:
        atomic {
            flag = 0; mydl = CLK(e) + L; send_claim(o);
            inread[e] = (how != STALLED)    /* the claim's timer runs */
        }
        if
        :: how == LOSTA || how == LOSTN ->
            /* the connection broke: sent again, same bytes, same timer */
            atomic { send_claim(o) }
        :: how == LOSTA || how == LOSTN     /* no connection in time */
        :: else
        fi;
        if
        :: how != OK -> inread[e] = 0; rtick[e] = 0; goto lost    /* 503 */
        :: else
        fi;
        /*
         * The reply is judged when it arrives, up to DELAY ticks after Redis
         * read the record (a later reply is a lost one, above).
         */
        atomic {
            inread[e] = 0; rtick[e] = 0;
            if
            :: rnil -> own_it(); goto owner
            :: !rnil && v.st == DONE -> goto done      /* replay */
            :: !rnil && v.st == LEASE && LIVE_LEASE -> goto wait
            :: else
            fi
        }
        /* an expired lease (owner presumed dead) or an unknown outcome */
#if POLICY == KEEP
#ifdef MUT_EXPIRED_FREE
        if
        :: v.st == LEASE ->
            atomic {
                mydl = CLK(e) + L;
                setrec(LEASE, o, mydl, 0, EXPAT(tick + L + T));
                own_it()
            };
            flag = 0; goto owner
        :: else
        fi;
#endif
        atomic {
            /* outcome-unknown only where the key may have run */
            assert(nsent || excused || UNKEXCUSE);
            BAD
        }
        goto done
#else
        atomic {
            flag = (POLICY == FORWARD); mydl = CLK(e) + L;
            fate(0);
            if
            :: how != LOSTN -> do_take(o, mydl)
            :: else
            fi;
            replicate(how);
            opend[e] = (how != OK);
            if
            :: how == OK && ret -> own_it()
            :: else
            fi
        }
        if
        :: how != OK -> goto lost
        :: ret -> ret = 0; goto owner
        :: else -> goto claim   /* someone else moved first: ask again */
        fi
#endif

wait:
        /* in progress: wait for a change or the deadline, then ask again */
endwait:
        atomic { !SAME(v) || CLK(e) > v.dl + MARGIN || GONE };
        goto claim;

owner:
        do
        :: atomic { DUE(e) -> renew(o) }
        :: atomic {
#ifdef FIX_SEND
            CLK(e) <= dack ->
#endif
            send_upstream(o)
           }; break
#ifdef FIX_SEND
        /* its lease no longer known live: 503, released (nothing ran) */
        :: atomic { CLK(e) > dack -> outc = NEVER }; break
#endif
#ifdef UPFAULT
        :: atomic { nup < MAXUP -> nup++; outc = NEVER }; break
#endif
        od;
        if
        :: outc != NEVER ->
            do
            :: atomic { DUE(e) -> renew(o) }
            :: break    /* the response, or its absence, is known */
            od
        :: else
        fi;
        /*
         * store, release or unknown, sent at once (renewals stop with it),
         * sent again until the deadline
         */
        if
        :: outc == STORE -> vst = DONE
        :: outc == NOHDR && POLICY != RELEASE -> vst = UNK
#ifdef FIX_TAKER_UNK
        /* a take-over inherits "may have run": it never frees the key */
        :: outc != STORE && outc != NOHDR && flag -> vst = UNK
#endif
        :: else -> vst = NONE
        fi;
        tries = 0;
        do
        :: tries > 0 && (CLK(e) > mydl || tries >= MAXTRY) ->
            atomic { relgaveup = relgaveup || vst == NONE; fpend[e] = 0 };
            break
        :: else ->
            tries++;
            atomic {
                renewing[e] = 0;
                fate(0);
                if
                :: how != LOSTN -> do_finish(o, vst, resp)
                :: else
                fi;
                replicate(how);
                if
                :: how == OK && vst == NONE && CLK(e) > mydl -> relgaveup = 1
                :: else
                fi;
                fpend[e] = (vst == NONE && how != OK)
            }
            if
            :: how == OK -> break
            :: else
            fi
        od;
        if
        :: outc == STORE -> skip        /* new */
        :: else -> BAD
        fi;
        goto done

lost:
        /* the claim reply never came: 503, then an owner-checked release */
        BAD;
        tries = 0;
        do
        :: tries > 0 && (CLK(e) > mydl || tries >= MAXTRY) ->
            atomic { excused = 1; opend[e] = 0 }; break
        :: else ->
            tries++;
            atomic {
#ifndef REORDER
                /* sent after the claim on its connection: it lands first */
                if
                :: pend[e].op == PCLAIM -> land(e)
                :: pend[e].op == PCLAIM -> pend[e].op = 0; pend[e].own = 0;
                                           pend[e].dl = 0
                :: else
                fi;
#endif
                fate(0);
                if
                :: how != LOSTN ->
#ifdef MUT_ORPHAN_DEL
                    expire(); setrec(NONE, 0, 0, 0, 0)
#else
#ifdef FIX_TAKER_UNK
                    /* a lost take-over is put back as unknown, not freed */
                    if
                    :: flag -> do_finish(o, UNK, 0)
                    :: else -> do_finish(o, NONE, 0)
                    fi
#else
                    do_finish(o, NONE, 0)
#endif
#endif
                :: else
                fi;
                replicate(how);
                /* acknowledged after the deadline: too late to prevent 502 */
                if
                :: how == OK && CLK(e) > mydl -> excused = 1
                :: else
                fi;
                opend[e] = (how != OK)
            }
            if
            :: how == OK -> break
            :: else
            fi
        od;
done:
        skip
        } unless {
            kill[e] -> atomic { kill[e] = 0; inread[e] = 0; rtick[e] = 0;
                                opend[e] = 0; fpend[e] = 0;
                                excused = 1; BAD }
        };
        /* the next request; locals cleared to keep the state space small */
        atomic {
            renewing[e] = 0; lastsend[e] = 0;
            outc = 0; resp = 0; ret = 0; tries = 0; how = 0; mydl = 0;
            dack = 0; vst = 0; rnil = 0; flag = 0;
            v.st = 0; v.own = 0; v.dl = 0; v.resp = 0; v.exp = 0;
            DONE1; r++
        }
    :: else -> break
    od
}

/* time; without SLOW it waits for every owner's due renewal */
#ifdef SLOW
#define TICKOK (tick < H && !ANYLATE)
#else
#define TICKOK (tick < H && !ANYDUE && !ANYLATE)
#endif

proctype clock() {
endclock:
    do
    :: atomic {
        TICKOK ->
#ifdef SLOW
        if
        :: ANYDUE -> excused = 1
        :: else
        fi;
#endif
        tick++
       }
    od
}

/* one death, at any step of any edge */
proctype killer() {
    if
    :: kill[0] = 1
    :: kill[1] = 1
#if NE == 3
    :: kill[2] = 1
#endif
    fi
}

/* Redis: stalled commands land, replication runs, one failover */
proctype redis() {
endredis:
    do
    :: atomic { pend[0].op != 0 -> land(0) }
    :: atomic { pend[1].op != 0 -> land(1) }
#if NE == 3
    :: atomic { pend[2].op != 0 -> land(2) }
#endif
#ifdef FAILOVER
    :: atomic { (rep.st != m.st || rep.own != m.own || rep.dl != m.dl
                 || rep.resp != m.resp || rep.exp != m.exp) ->
                rep.st = m.st; rep.own = m.own; rep.dl = m.dl;
                rep.resp = m.resp; rep.exp = m.exp }
    :: atomic { !failed -> failed = 1; excused = 1;
                m.st = rep.st; m.own = rep.own; m.dl = rep.dl;
                m.resp = rep.resp; m.exp = rep.exp }
#endif
    od
}

init {
    byte o1;
    atomic {
        off[0] = 0;
        select(o1 : 0 .. S); off[1] = o1;
#if NE == 3
        select(o1 : 0 .. S); off[2] = o1;
#endif
        run clock();
        run edge(0);
        run edge(1);
#if NE == 3
        run edge(2);
#endif
#ifdef DIE
        run killer();
#endif
#if defined(STALL) || defined(FAILOVER)
        run redis();
#endif
    }
}

#ifdef LIVE
/* without faults every request ends new or replay */
ltl live { <> (ndone == NO && !nbad) }
#endif
